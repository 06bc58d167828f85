#!/usr/bin/env bash
# Runs every test: installs dependencies, fetches the default model, builds the main tree and
# a sanitizer (ASan+UBSan) tree of the core libraries with the libFuzzer targets, then runs
# the sanitizer tests (core unit tests + a bounded fuzz run) and finally all tests.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh
scripts/fetch_model.sh
SPECD_PYTHON=$(scripts/python_env.sh)
SPECD_TOOLS_BIN=$(scripts/install_deploy_tools.sh)  # helm, kubectl (the Helm chart test)
scripts/install_container_tools.sh                    # podman, debootstrap (the container test)
export SPECD_PYTHON SPECD_TOOLS_BIN
# The services the tests start keep absl's mutex deadlock detection (off in production).
export SPECD_MUTEX_DEADLOCK_CHECKS=1
JOBS=${JOBS:-$(nproc)}

echo "== sanitizer build (ASan+UBSan, clang, core libraries + fuzzers)"
CC=clang-14 CXX=clang++-14 cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSPECD_SANITIZE=ON -DSPECD_FUZZ=ON -DSPECD_CORE_ONLY=ON >/dev/null
ninja -C build-asan -j"$JOBS"
echo "== sanitizer tests"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L 'core|fuzz' --output-on-failure -j"$JOBS"

echo "== main build"
BUILD_DIR=build JOBS="$JOBS" scripts/build.sh
echo "== all tests"
ctest --test-dir build --output-on-failure -j"$JOBS"
