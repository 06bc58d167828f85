# Sampling library: transforms, Philox, sampler, proposals, lossless speculative verification.
if(TARGET specd_sampling)
  specd_test(sampling_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/sampling_test.cc
    DEPS specd_sampling
    LABELS core
    TIMEOUT 120)
  # The blockwise verifier (what the CUDA sampling kernels run) on its host twin.
  specd_test(blockwise_verify_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/blockwise_verify_test.cc
    DEPS specd_sampling
    LABELS core
    TIMEOUT 300)
  specd_test(sampling_lossless_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/sampling_lossless_test.cc
    DEPS specd_sampling
    LABELS statistical
    TIMEOUT 300)
endif()
