#!/usr/bin/env bash
# Reproduces the shipped draft drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf: the exact
# specd-distill command and seed (docs/PERFORMANCE.md, "Distilled draft", has the run's figures).
# On the 2-core development machine (AMD EPYC, AVX-512 VNNI, 2026-12-05, sixth session): data 20.5
# min (specd distill-data, 12,800 responses to 6,400 prompts, 1.38 M positions at ~1,100 tok/s),
# training 30.6 min (1,700 steps of 16 rows, cut to their length; the loss is the KL plus twice the
# total variation); ~52 min in all. Work files (data, report.json, loss.png) go to
# ${1:-/tmp/specd-distill}.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="${1:-/tmp/specd-distill}"
exec "$ROOT/tools/distill/specd-distill" run \
  --target "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" --out-dir "$WORK" \
  --specd "$ROOT/build/tools/specd" \
  --seed 1 --prompt-seed 0 --num-train 6400 --num-eval 64 --max-new-tokens 128 \
  --temperatures 0,0.8 --gen-batch 16 \
  --layers 2 --init-layers 0,1 --head-vocab 8192 --steps 1700 --batch 16 --seq-len 256 \
  --lr 1.2e-3 --loss kl+tv --tv-weight 2 --layer-type q8_0 --head-type q8_0 \
  --output "$ROOT/drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf"
