# Kernel op-vs-reference harness (every backend against kernels/ref).
specd_test(kernel_ops_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/kernels/ops_test.cc
  DEPS specd_kernels_cpu specd_kernels_ref specd_gguf
  LABELS core
  TIMEOUT 120)

# Float-activation ("exact") MatMul against its reference twin.
specd_test(matmul_exact_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/kernels/matmul_exact_test.cc
  DEPS specd_kernels_cpu specd_kernels_ref specd_gguf
  LABELS core)
