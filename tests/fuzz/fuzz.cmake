# GGUF reader fuzzing. Owned by the GGUF component.
# The seed-corpus generator (not built by default): ninja gguf_make_fuzz_corpus &&
#   ./tests/gguf_make_fuzz_corpus ../tests/data/fuzz/gguf
add_executable(gguf_make_fuzz_corpus EXCLUDE_FROM_ALL
  ${PROJECT_SOURCE_DIR}/tests/fuzz/make_gguf_corpus.cc)
target_include_directories(gguf_make_fuzz_corpus PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_options(gguf_make_fuzz_corpus PRIVATE ${SPECD_WARNINGS})
target_link_libraries(gguf_make_fuzz_corpus PRIVATE specd_gguf)

if(SPECD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "SPECD_FUZZ needs clang (libFuzzer), e.g. CC=clang-14 CXX=clang++-14")
  endif()
  # Compile the reader's sources into the fuzzer itself so they get libFuzzer's coverage
  # instrumentation (-fsanitize=fuzzer), which must not leak into the ordinary library.
  get_target_property(_gguf_srcs specd_gguf SOURCES)
  get_target_property(_gguf_dir specd_gguf SOURCE_DIR)
  get_target_property(_gguf_libs specd_gguf LINK_LIBRARIES)
  list(TRANSFORM _gguf_srcs PREPEND "${_gguf_dir}/")
  set(_fuzz_flags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
  add_executable(gguf_reader_fuzz ${PROJECT_SOURCE_DIR}/tests/fuzz/gguf_reader_fuzz.cc
                 ${_gguf_srcs})
  target_include_directories(gguf_reader_fuzz PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(gguf_reader_fuzz PRIVATE ${SPECD_WARNINGS} ${_fuzz_flags})
  target_link_options(gguf_reader_fuzz PRIVATE ${_fuzz_flags})
  target_link_libraries(gguf_reader_fuzz PRIVATE ${_gguf_libs})

  # Fuzz a fresh copy of the seed corpus inside the build tree (the source tree stays clean).
  set(_run ${CMAKE_CURRENT_BINARY_DIR}/gguf_fuzz_run)
  add_test(NAME gguf_reader_fuzz_bounded
    COMMAND sh -c "rm -rf '${_run}' && mkdir -p '${_run}/corpus' '${_run}/artifacts' && cp '${PROJECT_SOURCE_DIR}/tests/data/fuzz/gguf/'* '${_run}/corpus/' && exec '$<TARGET_FILE:gguf_reader_fuzz>' -max_total_time=60 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 '-artifact_prefix=${_run}/artifacts/' '${_run}/corpus'"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(gguf_reader_fuzz_bounded PROPERTIES LABELS "fuzz" TIMEOUT 300)
endif()

# The OpenAI HTTP API's JSON request parser (services/router/http/openai_api.cc), compiled into
# its fuzzer the same way; seeds are request bodies in tests/data/fuzz/openai/.
if(SPECD_FUZZ)
    add_executable(openai_request_fuzz ${PROJECT_SOURCE_DIR}/tests/fuzz/openai_request_fuzz.cc
                 ${PROJECT_SOURCE_DIR}/services/router/http/openai_api.cc)
  target_include_directories(openai_request_fuzz PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(openai_request_fuzz PRIVATE ${SPECD_WARNINGS} ${_fuzz_flags})
  target_link_options(openai_request_fuzz PRIVATE ${_fuzz_flags})
  target_link_libraries(openai_request_fuzz PRIVATE specd_proto nlohmann_json::nlohmann_json
                        absl::status absl::strings)
  set(_orun ${CMAKE_CURRENT_BINARY_DIR}/openai_fuzz_run)
  add_test(NAME openai_request_fuzz_bounded
    COMMAND sh -c "rm -rf '${_orun}' && mkdir -p '${_orun}/corpus' '${_orun}/artifacts' && cp '${PROJECT_SOURCE_DIR}/tests/data/fuzz/openai/'* '${_orun}/corpus/' && exec '$<TARGET_FILE:openai_request_fuzz>' -max_total_time=60 -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 '-artifact_prefix=${_orun}/artifacts/' '${_orun}/corpus'"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(openai_request_fuzz_bounded PROPERTIES LABELS "fuzz" TIMEOUT 300)
endif()

# The router's handling of a Generation payload: parse (services/common/wire_parse.cc) and
# validate (services/router/request_validation.cc), both compiled into the fuzzer for
# coverage; seeds are serialized requests in tests/data/fuzz/router/ (protoc --encode).
if(SPECD_FUZZ)
  add_executable(router_request_fuzz ${PROJECT_SOURCE_DIR}/tests/fuzz/router_request_fuzz.cc
                 ${PROJECT_SOURCE_DIR}/services/common/wire_parse.cc
                 ${PROJECT_SOURCE_DIR}/services/router/request_validation.cc)
  target_include_directories(router_request_fuzz PRIVATE ${PROJECT_SOURCE_DIR})
  target_compile_options(router_request_fuzz PRIVATE ${SPECD_WARNINGS} ${_fuzz_flags})
  target_link_options(router_request_fuzz PRIVATE ${_fuzz_flags})
  target_link_libraries(router_request_fuzz PRIVATE specd_proto specd_testing specd_tokenizer
                        specd_sampling absl::flat_hash_map absl::status absl::strings)
  set(_rrun ${CMAKE_CURRENT_BINARY_DIR}/router_fuzz_run)
  add_test(NAME router_request_fuzz_bounded
    COMMAND sh -c "rm -rf '${_rrun}' && mkdir -p '${_rrun}/corpus' '${_rrun}/artifacts' && cp '${PROJECT_SOURCE_DIR}/tests/data/fuzz/router/'* '${_rrun}/corpus/' && exec '$<TARGET_FILE:router_request_fuzz>' -max_total_time=60 -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 '-artifact_prefix=${_rrun}/artifacts/' '${_rrun}/corpus'"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(router_request_fuzz_bounded PROPERTIES LABELS "fuzz" TIMEOUT 300)
endif()
