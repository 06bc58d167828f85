# Real processes on loopback (label: integration).
if(NOT SPECD_CORE_ONLY)
  specd_library(specd_cluster_harness
    SRCS ${PROJECT_SOURCE_DIR}/tests/integration/cluster_harness.cc
    DEPS specd_proto specd_testing GTest::gtest)
  specd_test(cluster_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/integration/cluster_test.cc
    DEPS specd_cluster_harness specd_engine specd_sampling specd_grpc_common
    LABELS integration TIMEOUT 300)
  add_dependencies(cluster_test specd-target specd-draft specd-router specd)
  specd_test(cluster_load_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/integration/cluster_load_test.cc
    DEPS specd_cluster_harness specd_testing LABELS integration TIMEOUT 180)
  add_dependencies(cluster_load_test specd-target specd-draft specd-router)
endif()
if(NOT SPECD_CORE_ONLY)
  specd_test(python_client_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/integration/python_client_test.cc
    DEPS specd_cluster_harness LABELS integration TIMEOUT 180)
  add_dependencies(python_client_test specd-target specd-draft specd-router)
endif()
if(NOT SPECD_CORE_ONLY)
  specd_test(openai_client_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/integration/openai_client_test.cc
    DEPS specd_cluster_harness LABELS integration TIMEOUT 240)
  add_dependencies(openai_client_test specd-target specd-draft specd-router)
endif()
if(NOT SPECD_CORE_ONLY)
  specd_test(cluster_tls_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/integration/cluster_tls_test.cc
    DEPS specd_cluster_harness LABELS integration TIMEOUT 180)
  add_dependencies(cluster_tls_test specd-target specd-draft specd-router specd)
endif()
