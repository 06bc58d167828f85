#!/usr/bin/env bash
# Configures and builds the main tree in build/ (Ninja, RelWithDebInfo).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@" >/dev/null
ninja -C "$BUILD_DIR" -j"${JOBS:-$(nproc)}"
