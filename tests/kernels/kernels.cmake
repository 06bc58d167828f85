# Kernel op-vs-reference harness (every backend against kernels/ref).
specd_test(kernel_ops_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/kernels/ops_test.cc
  DEPS specd_kernels_cpu specd_kernels_ref specd_gguf
  LABELS core
  # Under ASan the long-context cases (8,192 positions, every KV dtype, against the plain
  # reference) take minutes on 2 cores.
  TIMEOUT 360)

# Float-activation ("exact") MatMul against its reference twin.
specd_test(matmul_exact_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/kernels/matmul_exact_test.cc
  DEPS specd_kernels_cpu specd_kernels_ref specd_gguf
  LABELS core)

# The CUDA attention's host-side plan (plain C++: runs everywhere).
specd_test(cuda_plan_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/kernels/cuda_plan_test.cc
  DEPS specd_kernels_cuda_plan LABELS core)

# CUDA kernels vs reference (only when nvcc was found; skipped without a GPU).
if(SPECD_HAVE_CUDA)
  specd_test(cuda_ops_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/kernels/cuda_ops_test.cc
    DEPS specd_kernels_cuda specd_kernels_ref LABELS gpu)
  set_tests_properties(cuda_ops_test PROPERTIES SKIP_REGULAR_EXPRESSION "NOT RUN")
  # Speculative verification on the device vs VerifyDraft.
  specd_test(cuda_sampling_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/kernels/cuda_sampling_test.cc
    DEPS specd_kernels_cuda specd_sampling LABELS gpu)
  set_tests_properties(cuda_sampling_test PROPERTIES SKIP_REGULAR_EXPRESSION "NOT RUN")
endif()
# NCCL rank processes at world size 1 (only with the CUDA toolkit; skipped without a GPU).
if(SPECD_HAVE_CUDA AND NOT SPECD_CORE_ONLY)
  specd_test(nccl_communicator_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/kernels/nccl_communicator_test.cc
    DEPS specd_nccl_comm specd_testing LABELS gpu)
  set_tests_properties(nccl_communicator_test PROPERTIES SKIP_REGULAR_EXPRESSION "NOT RUN")
endif()
