# Owned by the engine's KV cache: copy-on-write against recompute for a shared block.
specd_tool(kv_cow_bench
  SRCS ${PROJECT_SOURCE_DIR}/tools/kv_cow_bench.cc
  DEPS specd_engine)
