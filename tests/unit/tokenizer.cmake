# Owned by the tokenizer component.
specd_test(tokenizer_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/tokenizer_test.cc
  DEPS specd_tokenizer specd_gguf
  LABELS core
  TIMEOUT 300)
