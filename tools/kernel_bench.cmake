# MatMul / memory-bandwidth benchmarks for the CPU kernels.
specd_tool(kernel_bench SRCS ${PROJECT_SOURCE_DIR}/tools/kernel_bench.cc DEPS specd_kernels_cpu benchmark::benchmark)
