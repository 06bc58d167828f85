#!/usr/bin/env bash
# Reproduces the shipped draft drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf: the exact
# specd-distill command and seed (docs/PERFORMANCE.md, "Distilled draft", has the run's figures).
# On the 2-core development machine (AMD EPYC, AVX-512 VNNI, 2026-12-05): data 15.5 min (specd
# distill-data, 9,600 responses to 4,800 prompts, 1.03 M positions at ~1,120 tok/s), training 21.7 min
# (1,280 steps of 16 rows, cut to their length); 37.7 min in all. Work files (data, report.json,
# loss.png) go to ${1:-/tmp/specd-distill}.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="${1:-/tmp/specd-distill}"
exec "$ROOT/tools/distill/specd-distill" run \
  --target "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" --out-dir "$WORK" \
  --specd "$ROOT/build/tools/specd" \
  --seed 1 --prompt-seed 0 --num-train 4800 --num-eval 64 --max-new-tokens 128 \
  --temperatures 0,0.8 --gen-batch 16 \
  --layers 2 --init-layers 0,1 --head-vocab 8192 --steps 1280 --batch 16 --seq-len 256 \
  --lr 1.2e-3 --layer-type q8_0 --head-type q8_0 \
  --output "$ROOT/drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf"
