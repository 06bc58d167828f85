#!/usr/bin/env bash
# Device check, part 2 (same warm machine): the real model on native AVX-512 VNNI, specd-bench
# AVX2 vs AVX-512 VNNI, then specd-bench --device cuda (the default model, and a
# Llama-3.2-1B-shaped random one written on the spot) against the device's measured ceilings.
set -u
R=$PWD; DEV=/tmp/stash/devbin; source $DEV/common.sh
mkdir -p models && cat /tmp/stash/part1 devm2/part > models/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum models/SmolLM2-135M-Instruct.Q4_1.gguf
echo "== llama_model_test, SPECD_KERNELS_ISA=avx512vnni"
SECONDS=0
SPECD_SOURCE_DIR=$R SPECD_KERNELS_ISA=avx512vnni timeout 300 $RUN $B/llama_model_test > $OUT/llama_model_test.log 2>&1
echo "rc=$? in ${SECONDS}s"; grep -E "PASSED|FAILED|observed|max|tests ran" $OUT/llama_model_test.log | head -30
echo "== specd-bench -t 2, alternating"
for isa in avx512vnni avx2 avx512vnni avx2; do
  echo "-- $isa"; SPECD_KERNELS_ISA=$isa timeout 60 $RUN $B/specd-bench -t 2 --no-llama-cpp 2>&1 | grep -vE "^\s*$"
done
echo "== the default model on the GPU (specd-bench --device cuda: decode batches, depth, prefill)"
SPECD_SOURCE_DIR=$R timeout 120 $RUN $B/specd-bench-cuda --device cuda -t 16 --no-llama-cpp --depth 128,2048,8000 \
  --prefill 512,2048 2>&1 | tee $OUT/specd_bench_cuda.txt | grep -vE "^\s*$" | head -40
echo "== a Llama-3.2-1B-shaped random model (Q4_1) on the GPU: decode against its roofline"
SECONDS=0
timeout 120 $RUN $B/specd-make-tiny-model -o /tmp/l1b.gguf --layers 16 --dim 2048 --ffn 8192 --heads 32 \
  --kv-heads 8 --ctx 8192 --vocab 128256 --type Q4_1 --untied && echo "written in ${SECONDS}s"
timeout 120 $RUN $B/specd-bench-cuda -m /tmp/l1b.gguf --device cuda --no-llama-cpp --steps 32 2>&1 \
  | tee $OUT/specd_bench_cuda_1b.txt | grep -vE "^\s*$" | head -30
echo "== speculation with the target and the distilled draft on the GPU (specd-bench --spec --device cuda)"
SPECD_SOURCE_DIR=$R timeout 150 $RUN $B/specd-bench-cuda --spec --device cuda --distilled-only --draft default \
  --prompts tools/distill/eval_prompts.jsonl --spec-prompts 8 --spec-tokens 48 --distilled-k 1,4 2>&1 \
  | tee $OUT/spec_bench_cuda.txt | grep -vE "^\s*$" | head -40
echo "== the PyTorch baseline: the same Llama decode step shapes, bf16, eager and CUDA graph"
for shape in smollm2-135m llama-3.2-1b; do
  timeout 120 python3 tools/device_check/torch_llama_step.py --shape $shape --context 128 --batches 1,8,32 2>&1 \
    | tee -a $OUT/torch_baseline.txt | tail -7
done
echo "-- default ISA, -t 16"; timeout 60 $RUN $B/specd-bench -t 16 --no-llama-cpp 2>&1
