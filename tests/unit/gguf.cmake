# GGUF component tests (reader, writer, reference quants). Owned by the GGUF component.
specd_test(gguf_quants_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/gguf_quants_test.cc
  DEPS specd_gguf
  LABELS core)
specd_test(gguf_file_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/gguf_file_test.cc
  DEPS specd_gguf
  LABELS core)
specd_test(gguf_corrupt_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/gguf_corrupt_test.cc
  DEPS specd_gguf
  LABELS core)
