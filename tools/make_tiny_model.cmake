specd_tool(specd-make-tiny-model SRCS ${CMAKE_CURRENT_SOURCE_DIR}/make_tiny_model.cc
  DEPS specd_testing specd_gguf absl::strings)
