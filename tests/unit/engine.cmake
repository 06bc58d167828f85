specd_test(paged_kv_cache_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/paged_kv_cache_test.cc
  DEPS specd_engine LABELS core)
specd_test(llama_model_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/llama_model_test.cc
  DEPS specd_engine specd_testing LABELS model TIMEOUT 900)
specd_test(tiny_model_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/tiny_model_test.cc
  DEPS specd_testing specd_engine specd_tokenizer LABELS core)
