#!/usr/bin/env bash
# Device check, part 2 (same warm machine, at once after part 1; carry devm2 and the shipped
# draft). The default model on the GPU: its goldens, specd-bench (decode batches, depth,
# prefill), CUDA graphs on / off, speculation (distilled draft, n-gram, self-draft) at batch
# 1 / 8 / 32, and the cluster (router + draft + target processes on the GPU) at concurrency 1
# and 16, speculation off vs auto. ~5 minutes. To $OUT: part2.log, goldens.log, bench.txt,
# graphs.txt, spec.txt, cluster.txt.
set -u
exec > >(tee "$OUT/part2.log") 2>&1
SECONDS=0
R=$PWD; DEV=/tmp/stash/devbin; source "$DEV/common.sh"
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p models && cat /tmp/stash/model.part1 devm2/part | unxz_to - > $M
echo "model sha256 $(sha256sum $M | cut -d' ' -f1), expected $(cat $DEV/model.sha256)"
ls -la drafts/ 2>&1 | tail -2
echo "== the default model's goldens on the GPU (default int8 mode) (at ${SECONDS}s)"
SPECD_SOURCE_DIR=$R SPECD_MODEL_TEST_DEVICE=$DEVICE timeout 60 $RUN $B/tests/llama_model_test \
  --gtest_filter=LlamaModelGoldenTest.SmolLM2Int8ActivationsStayCloseToReference >"$OUT/goldens.log" 2>&1
echo "rc=$?"; grep -E "OK|FAILED|NOT RUN|int8 mode|Failure|Which is|max" "$OUT/goldens.log" | head -20
BENCH="$RUN $B/tools/specd-bench -m $M --device $DEVICE --no-llama-cpp"
echo "== the default model on the GPU: decode batches, depth, prefill (at ${SECONDS}s)"
SPECD_SOURCE_DIR=$R timeout 60 $BENCH 2>&1 | tee "$OUT/bench.txt" | grep -vE "^\s*$" | head -24
SPECD_SOURCE_DIR=$R timeout 45 $BENCH --depth 128,2048,8000 2>&1 | tee -a "$OUT/bench.txt" | grep -vE "^\s*$" | tail -6
SPECD_SOURCE_DIR=$R timeout 45 $BENCH --prefill 512,2048,4096 2>&1 | tee -a "$OUT/bench.txt" | grep -vE "^\s*$" | tail -6
echo "== CUDA graphs on / off, alternating (SPECD_CUDA_GRAPHS) (at ${SECONDS}s)"
for g in on off on off; do
  [ $SECONDS -lt 200 ] || { echo "skipped: past 200 s"; break; }
  echo "-- graphs $g" | tee -a "$OUT/graphs.txt"
  SPECD_CUDA_GRAPHS=$g SPECD_SOURCE_DIR=$R timeout 40 $BENCH --steps 64 2>&1 | tee -a "$OUT/graphs.txt" \
    | grep -iE "decode batch|graph|launch"
done
echo "== speculation on the GPU: distilled draft, n-gram, self-draft; batch 1 / 8 / 32 (at ${SECONDS}s)"
[ $SECONDS -lt 250 ] && SPECD_SOURCE_DIR=$R timeout 110 $RUN $B/tools/specd-bench --spec -m $M --device $DEVICE --distilled-only \
  --draft drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf --prompts tools/distill/eval_prompts.jsonl --spec-prompts 32 --spec-tokens 32 \
  --distilled-k 4 --spec-batches 1,8,32 --spec-temps 0,0.8 2>&1 | tee "$OUT/spec.txt" | grep -vE "^\s*$" | head -60
[ $SECONDS -lt 300 ] && SPECD_SOURCE_DIR=$R timeout 70 $RUN $B/tools/specd-bench --spec -m $M --device $DEVICE --no-distilled --no-pair \
  --spec-prompts 8 --spec-tokens 64 2>&1 | tee -a "$OUT/spec.txt" | grep -vE "^\s*$" | head -40
echo "== the cluster on the GPU: router + draft + target processes (at ${SECONDS}s)"
if [ $SECONDS -lt 340 ]; then
  ROOT=$R BUILD=$B THREADS=$(nproc) PYTHON=python3
  export SPECD_TARGET_DEVICE=$DEVICE SPECD_DRAFT_DEVICE=$DEVICE
  . loadtest/cluster_lib.sh
  start_cluster device_check
  LT=$B/loadtest/specd-loadtest
  # random: 64-token prompts, the issue's TTFT shape (the model repeats itself after them, so
  # acceptance reads high); builtin: chat prompts, the honest acceptance.
  for prompts in random builtin; do
  for c in 1 16; do
    for spec in off auto; do
      n=$(( c == 1 ? 16 : 64 ))
      echo "-- concurrency $c, speculation $spec, prompts $prompts" | tee -a "$OUT/cluster.txt"
      timeout 30 $LT --server localhost:$PORT --mode closed --prompts $prompts --prompt-tokens 64 \
        --concurrency $c --requests $n --max-new-tokens 64 --spec $spec --out /tmp/lt.json 2>&1 | tail -3
      cat /tmp/lt.json >>"$OUT/cluster.txt"
      python3 - /tmp/lt.json <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["points"][0]
print(f"  ok {p['ok']}/{p['requests']}  tok/s {p['throughput_tokens_per_s']:.0f}  "
      f"TTFT p50 {p['ttft_ms']['p50']:.2f} ms p99 {p['ttft_ms']['p99']:.2f}  "
      f"ITL p50 {p['itl_ms']['p50']:.3f} ms p99 {p['itl_ms']['p99']:.3f}")
PY
    done
  done
  done
  stop_cluster
fi
echo "== the router hop on the GPU machine: unary, StepStream, step socket (at ${SECONDS}s)"
if [ $SECONDS -lt 380 ]; then
  PYTHON=python3 SPECD_BUILD=$B THREADS=$(nproc) ROUNDS=1 REQUESTS=8 timeout 120 loadtest/hop_cost.sh /tmp/hop 2>&1 \
    | grep -v "^run_cluster" | tee "$OUT/hop.txt" | tail -4
fi
echo "== compute-sanitizer memcheck: a short speculative run, the distilled draft on the GPU (at ${SECONDS}s)"
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$CS" ] && [ $SECONDS -lt 420 ]; then
  SPECD_SOURCE_DIR=$R timeout 120 "$CS" --tool memcheck --print-limit 5 $B/tools/specd-bench --spec -m $M \
    --device $DEVICE --distilled-only --draft drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf --spec-prompts 2 \
    --spec-tokens 8 --distilled-k 4 --spec-batches 1 --spec-temps 0 2>&1 | tail -15
fi
echo "== part 2 done in ${SECONDS}s"
