#!/usr/bin/env bash
# Device check, part 1 (packed by bundle.sh; carry devbin and devm1): the GPU first. The CUDA
# op harness, the whole forward on the CUDA backend (cuda_model_test) and NCCL at world size 1;
# a Llama-3.2-1B-shaped random model written on the spot and decoded on the GPU against the
# device's measured ceilings; the speculation cost model of a Llama-3-8B-shaped target with
# that draft (when the first 4 minutes leave room for it); the PyTorch baseline of the same
# step shapes. Stashes the binaries and the first part of the default model in /tmp for part 2.
# About 4 minutes, 7 with the cost model.
set -u
START=$(date +%s)
R=$PWD; DEV=$R/devbin; source $DEV/common.sh
mkdir -p /tmp/stash && cp -r $DEV /tmp/stash/ && cp devm1/part /tmp/stash/part1 &
echo "== host"; nproc; grep -m1 "model name" /proc/cpuinfo; nvidia-smi -L
gpu_test() {  # name: its log in $OUT, the lines that matter printed
  ( env LD_LIBRARY_PATH=$L $B/$1 2>&1 || $RUN $B/$1 2>&1 ) > $OUT/$1.log
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|NOT RUN|PASSED|Which is|max" $OUT/$1.log | head -60
}
echo "== cuda_ops_test (each CUDA kernel against its reference twin)"; gpu_test cuda_ops_test
echo "== cuda_model_test (the whole forward on the CUDA backend vs the reference backend)"; gpu_test cuda_model_test
echo "== nccl_communicator_test (world size 1: rendezvous, NCCL init, collectives on device)"
( env LD_LIBRARY_PATH=$L $B/nccl_communicator_test 2>&1 || $RUN $B/nccl_communicator_test 2>&1 ) | tail -6
echo "== a Llama-3.2-1B-shaped random model (Q4_1) on the GPU: decode against its roofline"
SECONDS=0
timeout 120 $RUN $B/specd-make-tiny-model -o /tmp/l1b.gguf --layers 16 --dim 2048 --ffn 8192 --heads 32 \
  --kv-heads 8 --ctx 8192 --vocab 128256 --type Q4_1 --untied && echo "written in ${SECONDS}s"
timeout 120 $RUN $B/specd-bench-cuda -m /tmp/l1b.gguf --device cuda --no-llama-cpp --steps 32 2>&1 \
  | tee $OUT/specd_bench_cuda_1b.txt | grep -vE "^\s*$" | head -30
if [ $(( $(date +%s) - START )) -lt 240 ]; then
  echo "== the speculation cost model: a Llama-3-8B-shaped target (Q4_1) with the 1B-shaped draft"
  SECONDS=0
  timeout 150 $RUN $B/specd-make-tiny-model -o /tmp/l8b.gguf --layers 32 --dim 4096 --ffn 14336 --heads 32 \
    --kv-heads 8 --ctx 8192 --vocab 128256 --type Q4_1 --untied && echo "written in ${SECONDS}s"
  timeout 90 $RUN $B/specd-bench-cuda -m /tmp/l8b.gguf --cost-model /tmp/l1b.gguf --device cuda 2>&1 \
    | tee $OUT/cost_model_8b_1b.txt | grep -vE "^\s*$" | head -20
  rm -f /tmp/l8b.gguf
else
  echo "== the cost model: skipped (no time left in this call)"
fi
echo "== the PyTorch baseline: the same Llama decode step shapes, bf16, eager and CUDA graph"
for shape in smollm2-135m llama-3.2-1b; do
  timeout 120 python3 tools/device_check/torch_llama_step.py --shape $shape --context 128 --batches 1,8,32 2>&1 \
    | tee -a $OUT/torch_baseline.txt | tail -7
done
wait; ls -la /tmp/stash
