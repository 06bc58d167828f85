# specd-distill end to end on a tiny generated model (tests/integration/distill_test.py): the
# interpreter is $SPECD_PYTHON (scripts/test.sh points it at the venv with jax, optax and gguf).
if(NOT SPECD_CORE_ONLY)
  add_test(NAME distill_test
    COMMAND sh -c "if [ -z \"$SPECD_PYTHON\" ]; then echo 'distill_test: SPECD_PYTHON is not set (scripts/test.sh sets it to the venv with jax, optax and gguf)'; exit 1; fi; exec \"$SPECD_PYTHON\" \"$0\" \"$1\" \"$2\""
      ${PROJECT_SOURCE_DIR}/tests/integration/distill_test.py $<TARGET_FILE:specd>
      $<TARGET_FILE:specd-make-tiny-model>)
  set_tests_properties(distill_test PROPERTIES LABELS "integration" TIMEOUT 300
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
endif()
