specd_tool(specd SRCS ${CMAKE_CURRENT_SOURCE_DIR}/specd_main.cc
  DEPS specd_engine specd_tokenizer specd_sampling absl::strings absl::str_format)
