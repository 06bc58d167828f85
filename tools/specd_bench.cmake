specd_tool(specd-bench SRCS ${CMAKE_CURRENT_SOURCE_DIR}/specd_bench.cc
  DEPS specd_engine absl::strings absl::str_format)
