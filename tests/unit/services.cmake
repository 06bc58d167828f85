# The cluster's services (not in the core-only build: they need gRPC/protobuf).
if(NOT SPECD_CORE_ONLY)
  specd_test(service_workers_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/service_workers_test.cc
    DEPS specd_target_worker specd_draft_worker specd_testing LABELS services TIMEOUT 300)
endif()
if(NOT SPECD_CORE_ONLY)
  specd_test(router_scheduler_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/router_scheduler_test.cc
    DEPS specd_router_core LABELS services)
endif()
if(NOT SPECD_CORE_ONLY)
  specd_test(router_engine_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/router_engine_test.cc
    DEPS specd_local_backends specd_testing LABELS services TIMEOUT 600)
endif()
if(NOT SPECD_CORE_ONLY)
  # The real default model (label model): prefix caching on == off through the router.
  specd_test(prefix_cache_model_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/prefix_cache_model_test.cc
    DEPS specd_local_backends LABELS model TIMEOUT 600)
endif()
if(NOT SPECD_CORE_ONLY)
  specd_test(router_validation_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/router_validation_test.cc
    DEPS specd_router_core specd_testing LABELS services)
endif()
if(NOT SPECD_CORE_ONLY)
  specd_test(openai_api_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/openai_api_test.cc
    DEPS specd_openai_api nlohmann_json::nlohmann_json LABELS services)
endif()
if(NOT SPECD_CORE_ONLY)
  specd_test(api_keys_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/api_keys_test.cc
    DEPS specd_router_core LABELS services)
endif()
if(NOT SPECD_CORE_ONLY)
  specd_test(wire_parse_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/wire_parse_test.cc
    DEPS specd_proto_convert LABELS services)
endif()
if(NOT SPECD_CORE_ONLY)
  specd_test(event_log_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/event_log_test.cc
    DEPS specd_event_log LABELS services)
endif()
if(NOT SPECD_CORE_ONLY)
  specd_test(step_socket_test
    SRCS ${PROJECT_SOURCE_DIR}/tests/unit/step_socket_test.cc
    DEPS specd_step_socket LABELS services)
endif()
