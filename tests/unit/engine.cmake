specd_test(paged_kv_cache_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/paged_kv_cache_test.cc
  DEPS specd_engine LABELS core)
specd_test(llama_model_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/llama_model_test.cc
  DEPS specd_engine specd_backend_factory specd_testing LABELS model TIMEOUT 900)
# The same tests (goldens, greedy continuations, batch invariance) on the AVX-512 VNNI
# kernels with AVX-512 emulated: the one end-to-end run of that code on a CPU without it.
add_test(NAME llama_model_test_vnni_emulated COMMAND llama_model_test)
set_tests_properties(llama_model_test_vnni_emulated PROPERTIES
  ENVIRONMENT "SPECD_SOURCE_DIR=${PROJECT_SOURCE_DIR};SPECD_BINARY_DIR=${PROJECT_BINARY_DIR};SPECD_KERNELS_ISA=vnni_emulated"
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR} LABELS model TIMEOUT 900)
specd_test(tiny_model_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/tiny_model_test.cc
  DEPS specd_testing specd_engine specd_tokenizer LABELS core)
# Rank processes' communicator (Gloo over TCP): not in the sanitizer (core) tree.
if(NOT SPECD_CORE_ONLY)
  specd_test(gloo_communicator_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/gloo_communicator_test.cc
    DEPS specd_gloo_comm specd_testing LABELS unit TIMEOUT 120)
endif()
# The device-resident forward on a backend whose memory the host cannot touch (the CPU's
# stand-in for a GPU backend).
specd_test(device_resident_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/device_resident_test.cc
  DEPS specd_engine specd_backend_factory specd_testing LABELS core)
# The model on the CUDA backend (label gpu; NOT RUN without a device): the tiny models against
# the reference backend, and the real model's default-mode goldens on the GPU.
if(SPECD_HAVE_CUDA)
  add_test(NAME llama_model_test_cuda COMMAND llama_model_test
    --gtest_filter=LlamaModelGoldenTest.SmolLM2Int8ActivationsStayCloseToReference)
  set_tests_properties(llama_model_test_cuda PROPERTIES
    ENVIRONMENT "SPECD_SOURCE_DIR=${PROJECT_SOURCE_DIR};SPECD_BINARY_DIR=${PROJECT_BINARY_DIR};SPECD_MODEL_TEST_DEVICE=cuda"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR} LABELS gpu SKIP_REGULAR_EXPRESSION "NOT RUN" TIMEOUT 300)
  specd_test(cuda_model_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/cuda_model_test.cc
    DEPS specd_engine specd_backend_factory specd_kernels_cuda specd_nccl_comm specd_spec specd_testing LABELS gpu)
  set_tests_properties(cuda_model_test PROPERTIES SKIP_REGULAR_EXPRESSION "NOT RUN")
endif()
# The packed weights' huge-page host memory.
specd_test(huge_page_arena_test
  SRCS ${PROJECT_SOURCE_DIR}/tests/unit/huge_page_arena_test.cc
  DEPS specd_engine specd_backend_factory LABELS core)
