# Kernel cost in TSC cycles per block (min over repetitions: robust on a loaded machine).
specd_tool(kernel_cycles SRCS ${PROJECT_SOURCE_DIR}/tools/kernel_cycles.cc DEPS specd_kernels_cpu specd_engine)
