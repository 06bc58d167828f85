#!/usr/bin/env bash
# Reproduces the shipped draft drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf: the exact
# specd-distill command and seed (docs/PERFORMANCE.md, "Distilled draft", has the run's figures).
# On the 2-core development machine: data ~20 min (specd distill-data, 2400 responses), training
# ~33 min (640 steps of 16 rows, cut to their length). Work files (data, report.json, loss.png) go to
# ${1:-/tmp/specd-distill}.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="${1:-/tmp/specd-distill}"
exec "$ROOT/tools/distill/specd-distill" run \
  --target "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" --out-dir "$WORK" \
  --specd "$ROOT/build/tools/specd" \
  --seed 1 --prompt-seed 0 --num-train 1200 --num-eval 64 --max-new-tokens 128 \
  --temperatures 0,0.8 --gen-batch 16 \
  --layers 2 --init-layers 0,1 --head-vocab 8192 --steps 640 --batch 16 --seq-len 256 \
  --lr 1.2e-3 --layer-type q8_0 --head-type q8_0 \
  --output "$ROOT/drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf"
