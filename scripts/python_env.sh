#!/usr/bin/env bash
# Creates .venv (git-ignored) with the Python packages the tests and tools need (grpcio +
# grpcio-tools + grpcio-reflection for the Python gRPC client test, the official `openai` client
# for the HTTP API test, matplotlib for loadtest/plot.py and the distillation report, jax + optax +
# gguf + numpy for specd-distill: CPU-only, ~100 MB, unlike torch's CUDA wheels; pinned: the
# shipped draft was trained with these; kubernetes-validate + PyYAML for the Helm chart test, with
# the Kubernetes schemas inside the package) and prints its interpreter path. Idempotent: pip runs only when an import
# fails.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv >&2
fi
if ! .venv/bin/python -c 'import grpc, grpc_tools, grpc_reflection, matplotlib, openai, jax, optax, gguf, numpy, kubernetes_validate, yaml' 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check \
    grpcio grpcio-tools grpcio-reflection matplotlib openai \
    jax==0.10.2 jaxlib==0.10.2 optax==0.2.8 gguf==0.19.0 numpy \
    kubernetes-validate==1.37.0 pyyaml >&2
fi
echo "$PWD/.venv/bin/python"
