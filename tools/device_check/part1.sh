#!/usr/bin/env bash
# Device check, part 1 (packed by bundle.sh): native AVX-512 VNNI kernels against the reference,
# the CUDA op test and the whole forward on the CUDA backend (cuda_model_test) on the GPU, kernel timings AVX2 vs AVX-512 VNNI. Stashes the binaries and the
# first part of the model in /tmp for part 2.
set -u
R=$PWD; DEV=$R/devbin; source $DEV/common.sh
mkdir -p /tmp/stash && cp -r $DEV /tmp/stash/ && cp devm1/part /tmp/stash/part1 &
echo "== host"; nproc; grep -m1 "model name" /proc/cpuinfo
echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512bw|avx512vl|avx512_vnni|avx_vnni|amx_int8)$' | tr '\n' ' ')"
ldd --version | head -1; nvidia-smi -L
echo "== kernel_ops_test (avx512vnni cases: $($RUN $B/kernel_ops_test --gtest_list_tests | grep -c avx512vnni))"
timeout 300 $RUN $B/kernel_ops_test --gtest_brief=1 > $OUT/kernel_ops_test.log 2>&1; echo "rc=$?"
grep -E "NOT RUN|PASSED|FAILED|tests ran" $OUT/kernel_ops_test.log | head -20
echo "== matmul_exact_test"; timeout 120 $RUN $B/matmul_exact_test --gtest_brief=1 2>&1 | tail -3
echo "== cuda_ops_test"
( env LD_LIBRARY_PATH=$L $B/cuda_ops_test 2>&1 || $RUN $B/cuda_ops_test 2>&1 ) > $OUT/cuda_ops_test.log
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|NOT RUN|PASSED" $OUT/cuda_ops_test.log | head -40
echo "== cuda_model_test (the whole forward on the CUDA backend vs the reference backend)"
( env LD_LIBRARY_PATH=$L $B/cuda_model_test 2>&1 || $RUN $B/cuda_model_test 2>&1 ) > $OUT/cuda_model_test.log
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|Failure|NOT RUN|PASSED|max" $OUT/cuda_model_test.log | head -40
echo "== nccl_communicator_test (world size 1: rendezvous, NCCL init, collectives on device)"
( env LD_LIBRARY_PATH=$L $B/nccl_communicator_test 2>&1 || $RUN $B/nccl_communicator_test 2>&1 ) | tail -6
echo "== kernel_cycles, pinned to one cpu, --no-dram --reps 400 (left avx2, right avx512vnni)"
PIN="taskset -c 3"; $PIN true 2>/dev/null || PIN=""
for i in 1 2; do
  for isa in avx2 avx512vnni; do
    $PIN $RUN $B/kernel_cycles --isa $isa --no-dram --reps 400 > $OUT/cyc_${i}_$isa.txt 2>&1
  done
  paste $OUT/cyc_${i}_avx2.txt $OUT/cyc_${i}_avx512vnni.txt | cut -c1-90
done
wait; ls -la /tmp/stash
