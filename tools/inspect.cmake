# Model inspector. Owned by the GGUF component.
specd_tool(specd-inspect
  SRCS ${CMAKE_CURRENT_SOURCE_DIR}/specd_inspect.cc
  DEPS specd_gguf absl::str_format absl::strings absl::statusor)
add_test(NAME specd_inspect_smoke
  COMMAND specd-inspect --metadata ${PROJECT_SOURCE_DIR}/tests/data/quant_goldens.gguf)
# A bad file must exit 1 with a message (not crash).
add_test(NAME specd_inspect_bad_file
  COMMAND sh -c "'$<TARGET_FILE:specd-inspect>' '${PROJECT_SOURCE_DIR}/tests/data/fuzz/gguf/trunc_metadata.gguf'; test $? -eq 1")
set_tests_properties(specd_inspect_smoke specd_inspect_bad_file PROPERTIES LABELS core)
