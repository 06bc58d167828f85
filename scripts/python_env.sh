#!/usr/bin/env bash
# Creates .venv (git-ignored) with the Python packages the tests need (the Python gRPC client
# test) and prints its interpreter path. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv >&2
fi
if ! .venv/bin/python -c 'import grpc, grpc_tools' 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check grpcio grpcio-tools >&2
fi
echo "$PWD/.venv/bin/python"
