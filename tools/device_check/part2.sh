#!/usr/bin/env bash
# Device check, part 2 (same warm machine; carry devm2): the default model on the GPU
# (specd-bench --device cuda: decode batches, depth, prefill; then speculation with the
# distilled draft), then, while the command's time allows, the CPU checks of earlier issues
# (native AVX-512 VNNI model goldens, specd-bench AVX2 vs AVX-512 VNNI, kernel timings).
set -u
R=$PWD; DEV=/tmp/stash/devbin; source $DEV/common.sh
mkdir -p models && cat /tmp/stash/part1 devm2/part > models/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum models/SmolLM2-135M-Instruct.Q4_1.gguf
SECONDS=0
echo "== the default model's goldens on the GPU (default int8 mode, llama_model_test_cuda)"
SPECD_SOURCE_DIR=$R SPECD_MODEL_TEST_DEVICE=cuda timeout 120 $RUN $B/llama_model_test_cuda \
  --gtest_filter=LlamaModelGoldenTest.SmolLM2Int8ActivationsStayCloseToReference 2>&1 \
  | tee $OUT/llama_model_test_cuda.log | grep -E "OK|FAILED|NOT RUN|int8 mode|Failure|pos" | head -30
echo "== the default model on the GPU (specd-bench --device cuda)"
SPECD_SOURCE_DIR=$R timeout 120 $RUN $B/specd-bench-cuda --device cuda -t 16 --no-llama-cpp 2>&1 \
  | tee $OUT/specd_bench_cuda.txt | grep -vE "^\s*$" | head -20
SPECD_SOURCE_DIR=$R timeout 90 $RUN $B/specd-bench-cuda --device cuda -t 16 --no-llama-cpp --depth 128,2048,8000 2>&1 \
  | tee -a $OUT/specd_bench_cuda.txt | grep -vE "^\s*$" | tail -6
SPECD_SOURCE_DIR=$R timeout 90 $RUN $B/specd-bench-cuda --device cuda -t 16 --no-llama-cpp --prefill 512,2048,4096 2>&1 \
  | tee -a $OUT/specd_bench_cuda.txt | grep -vE "^\s*$" | tail -5
echo "== CUDA graphs on / off, alternating (SPECD_CUDA_GRAPHS; decode batches 1 / 4 / 16)"
for g in on off on off; do
  echo "-- graphs $g"
  SPECD_CUDA_GRAPHS=$g SPECD_SOURCE_DIR=$R timeout 60 $RUN $B/specd-bench-cuda --device cuda -t 16 --no-llama-cpp \
    --steps 64 2>&1 | tee -a $OUT/cuda_graphs_on_off.txt | grep -E "decode batch|step graphs"
done
echo "== speculation with the target and the distilled draft on the GPU (specd-bench --spec --device cuda)"
SPECD_SOURCE_DIR=$R timeout 150 $RUN $B/specd-bench-cuda --spec --device cuda --distilled-only --draft default \
  --prompts tools/distill/eval_prompts.jsonl --spec-prompts 8 --spec-tokens 48 --distilled-k 1,4 2>&1 \
  | tee $OUT/spec_bench_cuda.txt | grep -vE "^\s*$" | head -40
echo "== GPU part done in ${SECONDS}s; CPU checks while time allows"
if [ $SECONDS -lt 360 ]; then
  echo "== llama_model_test, SPECD_KERNELS_ISA=avx512vnni"
  SPECD_SOURCE_DIR=$R SPECD_KERNELS_ISA=avx512vnni timeout 150 $RUN $B/llama_model_test > $OUT/llama_model_test.log 2>&1
  echo "rc=$?"; grep -E "PASSED|FAILED|observed|max|tests ran" $OUT/llama_model_test.log | head -30
fi
if [ $SECONDS -lt 480 ]; then
  echo "== specd-bench -t 2, alternating"
  for isa in avx512vnni avx2; do
    echo "-- $isa"; SPECD_KERNELS_ISA=$isa timeout 40 $RUN $B/specd-bench -t 2 --no-llama-cpp 2>&1 | grep -vE "^\s*$"
  done
fi
echo "== done in ${SECONDS}s"
