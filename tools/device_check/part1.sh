#!/usr/bin/env bash
# Device check, part 1 (bundle.sh packs it; carry devbin and devm1). The GPU's own checks: every
# `gpu` test binary (CUDA ops and sampling against their reference twins, the plan, the whole
# forward on the CUDA backend, NCCL at world size 1); a Llama-3.2-1B-shaped random model decoded
# on the GPU against the device's measured ceilings; the speculation cost model of a
# Llama-3-8B-shaped target with that draft; the PyTorch baseline of the same step shapes.
# Stashes the binaries and the first part of the model in /tmp/stash for part 2. ~4 minutes.
# Everything goes to $OUT: part1.log (this output), gpu_tests.log, bench_1b_8b.txt, torch.txt.
# QUICK=1: the tests and the stash only (a second lease of the same session: the benchmarks
# of the 1B/8B shapes and PyTorch need not run again).
set -u
exec > >(tee "$OUT/part1.log") 2>&1
SECONDS=0
R=$PWD; DEV=$R/devbin; source "$DEV/common.sh"
mkdir -p /tmp/stash && cp -r "$DEV" /tmp/stash/ && cp devm1/part /tmp/stash/model.part1
echo "== host"; nproc; grep -m1 "model name" /proc/cpuinfo; nvidia-smi -L 2>&1 | head -2
ldd --version 2>&1 | head -1
QUICK=${QUICK:-0}
# The benchmark models are written on the CPU while the GPU tests run (shapes only: tiled weights).
MK="$RUN $B/tools/specd-make-tiny-model --ctx 8192 --vocab 128256 --type Q4_1 --untied --tile-weights"
[ "$QUICK" = 1 ] || ( $MK -o /tmp/l1b.gguf --layers 16 --dim 2048 --ffn 8192 --heads 32 --kv-heads 8 >/tmp/l1b.log 2>&1
  echo "1B written at ${SECONDS}s" >>/tmp/l1b.log ) &
W1=$!
[ "$QUICK" = 1 ] || ( $MK -o /tmp/l8b.gguf --layers 32 --dim 4096 --ffn 14336 --heads 32 --kv-heads 8 >/tmp/l8b.log 2>&1
  echo "8B written at ${SECONDS}s" >>/tmp/l8b.log ) &
W8=$!
gpu_test() {  # binary [args]: full log to gpu_tests.log, the lines that matter printed
  echo "######## $1" >>"$OUT/gpu_tests.log"
  SPECD_SOURCE_DIR=$R timeout 45 $RUN "$B/tests/$@" >/tmp/t.log 2>&1; local rc=$?
  cat /tmp/t.log >>"$OUT/gpu_tests.log"
  echo "== $1: rc=$rc at ${SECONDS}s"
  grep -E "^\[ +(FAILED|SKIPPED) +\]|Failure|NOT RUN|PASSED|tests ran|Which is|Expected|error" /tmp/t.log | head -25
}
gpu_test cuda_ops_test
gpu_test cuda_sampling_test
gpu_test cuda_plan_test
gpu_test cuda_model_test
gpu_test nccl_communicator_test
if [ "$QUICK" = 1 ]; then ls -la /tmp/stash; echo "== part 1 (quick) done in ${SECONDS}s"; exit 0; fi
echo "== the PyTorch baseline: Llama decode step shapes, bf16, eager and CUDA graph (at ${SECONDS}s)"
for shape in smollm2-135m llama-3.2-1b llama-3-8b; do
  [ "${TORCH:-1}" = 1 ] || { echo "skipped (TORCH=0)"; break; }
  [ $SECONDS -lt 170 ] || { echo "skipped $shape: past 170 s"; continue; }
  timeout 60 python3 tools/device_check/torch_llama_step.py --shape $shape --context 128 \
    --batches 1,8,32 --reps 30 2>&1 | tee -a "$OUT/torch.txt" | tail -7
done
wait $W1; cat /tmp/l1b.log
echo "== the 1B-shaped random model (Q4_1) on the GPU: decode against its roofline (at ${SECONDS}s)"
timeout 90 $RUN $B/tools/specd-bench -m /tmp/l1b.gguf --device $DEVICE --no-llama-cpp --steps 32 2>&1 \
  | tee "$OUT/bench_1b_8b.txt" | grep -vE "^\s*$" | head -30
if [ $SECONDS -lt 250 ]; then wait $W8; cat /tmp/l8b.log; else echo "cost model skipped: past 250 s"; kill $W8; fi
echo "== the speculation cost model: 8B-shaped target, 1B-shaped draft (at ${SECONDS}s)"
timeout 100 $RUN $B/tools/specd-bench -m /tmp/l8b.gguf --cost-model /tmp/l1b.gguf --device $DEVICE 2>&1 \
  | tee -a "$OUT/bench_1b_8b.txt" | grep -vE "^\s*$" | head -30
if [ -x $B/tools/specd-bench-before ]; then
  # An A/B of a kernel change: the binary before it, alternating with the one after, same models.
  echo "== A/B: specd-bench-before vs specd-bench, decode, alternating (at ${SECONDS}s)"
  for m in /tmp/l1b.gguf /tmp/l8b.gguf; do
    [ -f $m ] || continue
    for round in 1 2; do
      [ $SECONDS -lt 300 ] || { echo "A/B round skipped: past 300 s"; break; }
      for which in specd-bench-before specd-bench; do
        echo "-- $(basename $m) $which round $round" | tee -a "$OUT/ab.txt"
        timeout 60 $RUN $B/tools/$which -m $m --device $DEVICE --no-llama-cpp --steps 32 2>&1 \
          | tee -a "$OUT/ab.txt" | grep -E "^decode batch"
      done
    done
  done
fi
rm -f /tmp/l8b.gguf /tmp/l1b.gguf
ls -la /tmp/stash; echo "== part 1 done in ${SECONDS}s"
