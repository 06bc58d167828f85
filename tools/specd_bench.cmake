specd_tool(specd-bench SRCS ${CMAKE_CURRENT_SOURCE_DIR}/specd_bench.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/spec_bench.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/cost_model_bench.cc
  DEPS specd_engine specd_backend_factory specd_spec absl::strings absl::str_format
    nlohmann_json::nlohmann_json)
# The build dir holds no copy of the llama.cpp comparison script: point at the source tree.
target_compile_definitions(specd-bench PRIVATE
  SPECD_LLAMA_CPP_BENCH_PY="${CMAKE_CURRENT_SOURCE_DIR}/llama_cpp_bench.py")
