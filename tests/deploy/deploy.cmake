# The Helm chart and the monitoring config (tests/deploy/helm_chart_test.py): helm from
# $SPECD_TOOLS_BIN (scripts/install_deploy_tools.sh), kubernetes-validate in $SPECD_PYTHON's
# venv, Debian's prometheus and promtool; the chart's command lines run the real services.
if(NOT SPECD_CORE_ONLY)
  add_test(NAME helm_chart_test
    COMMAND sh -c "if [ -z \"$SPECD_PYTHON\" ]; then echo 'helm_chart_test: SPECD_PYTHON is not set (scripts/test.sh sets it to the venv with kubernetes-validate)'; exit 1; fi; exec \"$SPECD_PYTHON\" \"$0\" \"$1\""
      ${PROJECT_SOURCE_DIR}/tests/deploy/helm_chart_test.py ${PROJECT_BINARY_DIR})
  set_tests_properties(helm_chart_test PROPERTIES LABELS "integration;deploy" TIMEOUT 400)
endif()
# The container image (tests/deploy/container_test.sh): podman and debootstrap from
# scripts/install_container_tools.sh; root, as debootstrap and rootful podman need it.
if(NOT SPECD_CORE_ONLY)
  add_test(NAME container_test
    COMMAND ${PROJECT_SOURCE_DIR}/tests/deploy/container_test.sh ${PROJECT_BINARY_DIR})
  set_tests_properties(container_test PROPERTIES LABELS "integration;deploy" TIMEOUT 900
    RUN_SERIAL TRUE)
endif()
