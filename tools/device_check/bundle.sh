#!/usr/bin/env bash
# Packs what the device-machine check needs (part1.sh, part2.sh) into ignored folders of the repo
# root, sized for the device tool's limit of 64 MiB per call (the working tree counted in):
#   devbin/  payload.txz (the binaries in build-tree layout and the shared libraries they need:
#            glibc's and libstdc++ apart, used only when the device's own are too old) + scripts
#   devm1/   the first part of the default model, xz-compressed (travels with part 1)
#   devm2/   the rest (travels with part 2, on the same warm machine)
# Usage: tools/device_check/bundle.sh [BUILD_DIR]   (default build: Release, CUDA on)
# The shipped draft (14 MB) would travel in both calls as a tracked file; it is needed only in
# the second, so `tools/device_check/draft_travel.sh carry` untracks and ignores it for the
# device calls and `... restore` puts it back (run that before any commit).
# Then: run "bash devbin/part1.sh" carrying devbin + devm1 and, at once, "bash
# /tmp/stash/devbin/part2.sh" carrying devm2 and the draft (the machine stays warm for 30 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
BINS=(tests/cuda_ops_test tests/cuda_sampling_test tests/cuda_plan_test tests/nccl_communicator_test
      tests/cuda_model_test tests/llama_model_test tools/specd-bench tools/specd tools/specd-make-tiny-model
      services/specd-target services/specd-draft services/specd-router loadtest/specd-loadtest)
ninja -C "$BUILD" $(for b in "${BINS[@]}"; do basename "$b"; done)
# EXTRA_BINS: more build-tree paths to carry as they are (an A/B twin such as
# tools/specd-bench-before, copied into the build tree by hand).
# shellcheck disable=SC2206
BINS+=(${EXTRA_BINS:-})
for d in devbin devm1 devm2; do
  grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
done
rm -rf devbin devm1 devm2 && mkdir -p devbin/build devbin/lib/sys devm1 devm2
for b in "${BINS[@]}"; do mkdir -p "devbin/build/$(dirname "$b")" && cp "$BUILD/$b" "devbin/build/$b"; done
strip devbin/build/*/* 2>/dev/null || true  # symbols are not needed there: every byte counts
cp tools/device_check/{common,part1,part2}.sh devbin/
for b in devbin/build/*/*; do ldd "$b" | awk '/=>/{print $3}'; done | sort -u | while read -r l; do
  case $(basename "$l") in
    libcublas*|libnccl*|libcudart*|libcuda.*) ;;  # the device machine's CUDA install has them (common.sh)
    libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|libgcc_s*|libstdc++*) cp -L "$l" devbin/lib/sys/ ;;
    *) cp -L "$l" devbin/lib/ ;;
  esac
done
cp -L /lib64/ld-linux-x86-64.so.2 devbin/lib/sys/
# xz with a dictionary larger than one binary: the binaries share most of their code.
XZ_OPT=-9 tar cJf devbin/payload.txz -C devbin build lib && rm -rf devbin/build devbin/lib
# The model, xz-compressed, split so that each call stays under 64 MiB with the working tree.
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum "$M" | cut -d' ' -f1 > devbin/model.sha256
xz -T2 -6 -c "$M" > devm2/all.xz
DRAFT=drafts/$(basename "${M%.gguf}").draft.gguf
TREE=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | grep -zv "^$DRAFT\$" \
  | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
DRAFT_BYTES=$(stat -c %s "$DRAFT")
LIMIT=$(( 64 * 1024 * 1024 - 1024 * 1024 ))  # 1 MiB of slack
BIN=$(du -sb devbin | cut -f1); ALL=$(stat -c %s devm2/all.xz)
FIRST=$(( LIMIT - TREE - BIN ))
[ $FIRST -gt 0 ] && [ $(( ALL - FIRST )) -lt $(( LIMIT - TREE - DRAFT_BYTES )) ] \
  || { echo "bundle too large to carry: tree $TREE, binaries $BIN, model $ALL bytes" >&2; exit 1; }
head -c $FIRST devm2/all.xz > devm1/part && tail -c +$((FIRST + 1)) devm2/all.xz > devm2/part
rm devm2/all.xz
echo "tree $TREE B (without the draft); call 1 carries $(( BIN + FIRST )) B, call 2 $(( ALL - FIRST + DRAFT_BYTES )) B"
du -sh devbin devm1 devm2
