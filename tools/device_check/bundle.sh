#!/usr/bin/env bash
# Packs what the device-machine check needs (see part1.sh / part2.sh) into three ignored folders
# of the repo root, sized for the device tool's 64 MiB-per-call limit:
#   devbin/  binaries, their shared libraries (plus loader/libc as a fallback) and these scripts
#   devm1/   the first 40 MiB of the default model (travels with part 1, stashed in /tmp there)
#   devm2/   the rest of the model (travels with part 2 on the same warm machine)
# Usage: tools/device_check/bundle.sh [CPU_BUILD_DIR] [CUDA_BUILD_DIR]
# (defaults build-lead and build-cuda: a Release tree and one configured with -DSPECD_CUDA=ON)
# Then: run "bash devbin/part1.sh" carrying devbin + devm1, and at once
#       "bash /tmp/stash/devbin/part2.sh" carrying devm2.
set -euo pipefail
cd "$(dirname "$0")/../.."
CPU=${1:-build-lead}; CUDA=${2:-build-cuda}
ninja -C "$CPU" kernel_ops_test llama_model_test matmul_exact_test specd-bench kernel_cycles specd-make-tiny-model
ninja -C "$CUDA" cuda_ops_test nccl_communicator_test cuda_model_test specd-bench
for d in devbin devm1 devm2; do
  grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
done
rm -rf devbin devm1 devm2 && mkdir -p devbin/bin devbin/lib/sys devm1 devm2
cp "$CPU"/tests/{kernel_ops_test,llama_model_test,matmul_exact_test} "$CPU"/tools/{specd-bench,kernel_cycles} \
   "$CUDA"/tests/{cuda_ops_test,nccl_communicator_test,cuda_model_test} devbin/bin/
cp "$CUDA"/tools/specd-bench devbin/bin/specd-bench-cuda
cp "$CPU"/tools/specd-make-tiny-model devbin/bin/
cp tools/device_check/{common,part1,part2}.sh devbin/
for b in devbin/bin/*; do ldd "$b" | awk '/=>/{print $3}'; done | sort -u | while read -r l; do
  case $l in *libabsl*|*pcre*) cp -L "$l" devbin/lib/ ;; *) cp -L "$l" devbin/lib/sys/ ;; esac
done
cp -L /lib64/ld-linux-x86-64.so.2 devbin/lib/sys/
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
head -c 41943040 "$M" > devm1/part && tail -c +41943041 "$M" > devm2/part
du -sh devbin devm1 devm2
