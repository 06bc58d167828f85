specd_tool(specd-bench SRCS ${CMAKE_CURRENT_SOURCE_DIR}/specd_bench.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/spec_bench.cc
  DEPS specd_engine specd_spec absl::strings absl::str_format)
