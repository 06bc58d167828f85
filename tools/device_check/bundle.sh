#!/usr/bin/env bash
# Packs what the device-machine check needs (see part1.sh / part2.sh) into three ignored folders
# of the repo root, sized for the device tool's 64 MiB-per-call limit:
#   devbin/  binaries, their shared libraries (plus loader/libc as a fallback) and these scripts
#   devm1/   the first part of the default model, as much as fits beside devbin (travels with part 1,
#            stashed in /tmp there)
#   devm2/   the rest of the model (travels with part 2 on the same warm machine)
# Usage: tools/device_check/bundle.sh [CPU_BUILD_DIR] [CUDA_BUILD_DIR]
# (defaults build-lead and build-cuda: a Release tree and one configured with -DSPECD_CUDA=ON)
# Then: run "bash devbin/part1.sh" carrying devbin + devm1, and at once
#       "bash /tmp/stash/devbin/part2.sh" carrying devm2.
set -euo pipefail
cd "$(dirname "$0")/../.."
CPU=${1:-build-lead}; CUDA=${2:-build-cuda}
ninja -C "$CPU" llama_model_test specd-bench specd-make-tiny-model
ninja -C "$CUDA" cuda_ops_test nccl_communicator_test cuda_model_test specd-bench llama_model_test
for d in devbin devm1 devm2; do
  grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
done
rm -rf devbin devm1 devm2 && mkdir -p devbin/bin devbin/lib/sys devm1 devm2
cp "$CPU"/tests/llama_model_test "$CPU"/tools/specd-bench \
   "$CUDA"/tests/{cuda_ops_test,nccl_communicator_test,cuda_model_test} devbin/bin/
cp "$CUDA"/tools/specd-bench devbin/bin/specd-bench-cuda
cp "$CUDA"/tests/llama_model_test devbin/bin/llama_model_test_cuda
cp "$CPU"/tools/specd-make-tiny-model devbin/bin/
strip devbin/bin/* 2>/dev/null || true  # symbols are not needed there: every byte counts against the carry
cp tools/device_check/{common,part1,part2}.sh devbin/
for b in devbin/bin/*; do ldd "$b" | awk '/=>/{print $3}'; done | sort -u | while read -r l; do
  case $l in
    *libabsl*|*pcre*) cp -L "$l" devbin/lib/ ;;
    *libcublas*|*libnccl*) ;;  # hundreds of MiB: the device machine's CUDA install has them (common.sh)
    *) cp -L "$l" devbin/lib/sys/ ;;
  esac
done
cp -L /lib64/ld-linux-x86-64.so.2 devbin/lib/sys/
# Binaries and libraries travel gzipped (common.sh unpacks them there): a third of the bytes.
tar czf devbin/payload.tgz -C devbin bin lib && rm -rf devbin/bin devbin/lib
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
# Split so that devbin + devm1 and devm2 each stay under the 64 MiB a call may carry.
BIN_KIB=$(du -sk devbin | cut -f1); M_BYTES=$(stat -c %s "$M")
FIRST=$(( (64 * 1024 - 1024 - BIN_KIB) * 1024 ))
[ $FIRST -gt 0 ] && [ $(( M_BYTES - FIRST )) -lt $(( 63 * 1024 * 1024 )) ] || { echo "bundle too large to carry" >&2; exit 1; }
head -c $FIRST "$M" > devm1/part && tail -c +$((FIRST + 1)) "$M" > devm2/part
du -sh devbin devm1 devm2
