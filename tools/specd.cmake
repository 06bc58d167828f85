specd_tool(specd SRCS ${CMAKE_CURRENT_SOURCE_DIR}/specd_main.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/specd_client.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/spec_generate.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/distill_data.cc
  DEPS specd_engine specd_backend_factory specd_tokenizer specd_sampling specd_spec specd_proto absl::strings
    absl::str_format nlohmann_json::nlohmann_json)
