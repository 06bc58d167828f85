# Tensor-parallel ranks as processes (tests/integration/tp_ranks_test.py): real specd-target
# rank processes and routers on loopback, the default model and a tiny one; $SPECD_PYTHON is
# the venv with grpcio.
if(NOT SPECD_CORE_ONLY)
  add_test(NAME tp_ranks_test
    COMMAND sh -c "if [ -z \"$SPECD_PYTHON\" ]; then echo 'tp_ranks_test: SPECD_PYTHON is not set (scripts/test.sh sets it to the venv with grpcio)'; exit 1; fi; exec \"$SPECD_PYTHON\" \"$0\" \"$1\" \"$2\""
      ${PROJECT_SOURCE_DIR}/tests/integration/tp_ranks_test.py ${PROJECT_BINARY_DIR}
      ${PROJECT_SOURCE_DIR}/models/SmolLM2-135M-Instruct.Q4_1.gguf)
  set_tests_properties(tp_ranks_test PROPERTIES LABELS "integration;model" TIMEOUT 600)
endif()
