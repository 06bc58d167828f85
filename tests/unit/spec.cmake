# Speculative decoding engine (speculation/): drafters, adaptive k, SpecEngine.
specd_test(spec_adaptive_k_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/spec_adaptive_k_test.cc
  DEPS specd_spec
  LABELS core)
specd_test(spec_engine_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/spec_engine_test.cc
  DEPS specd_spec specd_testing
  LABELS core
  TIMEOUT 300)
specd_test(spec_lossless_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/spec_lossless_test.cc
  DEPS specd_spec specd_testing
  LABELS statistical
  TIMEOUT 600)
specd_test(spec_model_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/spec_model_test.cc
  DEPS specd_spec specd_testing
  LABELS model
  TIMEOUT 900)
specd_test(spec_loop_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/spec_loop_test.cc
  DEPS specd_spec_policy
  LABELS core)
