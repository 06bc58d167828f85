# specd-loadtest itself (tests/integration/loadtest_test.py): in process on the default model,
# requests end at the end of turn with --ignore-eos 0 and run to --max-new-tokens with 1.
if(NOT SPECD_CORE_ONLY)
  add_test(NAME loadtest_test
    COMMAND sh -c "if [ -z \"$SPECD_PYTHON\" ]; then echo 'loadtest_test: SPECD_PYTHON is not set (scripts/test.sh sets it)'; exit 1; fi; exec \"$SPECD_PYTHON\" \"$0\" \"$1\" \"$2\""
      ${PROJECT_SOURCE_DIR}/tests/integration/loadtest_test.py
      $<TARGET_FILE:specd-loadtest>
      ${PROJECT_SOURCE_DIR}/models/SmolLM2-135M-Instruct.Q4_1.gguf)
  set_tests_properties(loadtest_test PROPERTIES LABELS "integration;model" TIMEOUT 120)
endif()
