# Owned by the tokenizer component.
specd_tool(tokenizer_bench
  SRCS ${PROJECT_SOURCE_DIR}/tools/tokenizer_bench.cc
  DEPS specd_tokenizer specd_gguf benchmark::benchmark)
