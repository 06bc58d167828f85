#!/usr/bin/env bash
# The cluster benchmark of docs/DESIGN.md §4-§6 in one run, on the default model:
#   1. throughput, closed loop (4 clients): cluster vs the same engine in-process (no gRPC);
#   2. batch 1 (1 client): inter-token latency added by the cluster, and TTFT p50 for a
#      64-token prompt;
#   3. the latency-vs-QPS curve with and without speculation (loadtest/sweep.sh).
# Prints one summary with the goals; JSONs go to OUT_DIR (default /tmp/specd-cluster-bench).
#
#   loadtest/cluster_bench.sh [OUT_DIR]
# Environment: SPECD_BUILD [build], THREADS per model service [all cores], SWEEP=0 skips 3.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/specd-cluster-bench}"
BUILD="${SPECD_BUILD:-$ROOT/build}"
THREADS="${THREADS:-$(nproc)}"
MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
LOADTEST="$BUILD/loadtest/specd-loadtest"
[ -x "$LOADTEST" ] || { echo "cluster_bench: $LOADTEST missing (build first)" >&2; exit 1; }
PYTHON="$("$ROOT/scripts/python_env.sh")"
mkdir -p "$OUT"
# shellcheck source=loadtest/cluster_lib.sh
. "$ROOT/loadtest/cluster_lib.sh"
start_cluster cluster_bench

COMMON=(--mode closed --prompts random --prompt-tokens 64 --spec off)
run() {  # name, extra flags...
  local name="$1"; shift
  echo "cluster_bench: $name" >&2
  "$LOADTEST" "$@" --out "$OUT/$name.json"
}
# Warm both paths once (page cache, thread pools).
"$LOADTEST" --server "localhost:$PORT" "${COMMON[@]}" --concurrency 1 --requests 2 \
  --max-new-tokens 4 >/dev/null
run cluster_throughput --server "localhost:$PORT" "${COMMON[@]}" --concurrency 4 --requests 12 \
  --max-new-tokens 32
run inproc_throughput --in-process-model "$MODEL" --threads "$THREADS" "${COMMON[@]}" \
  --concurrency 4 --requests 12 --max-new-tokens 32
run cluster_batch1 --server "localhost:$PORT" "${COMMON[@]}" --concurrency 1 --requests 8 \
  --max-new-tokens 32
run inproc_batch1 --in-process-model "$MODEL" --threads "$THREADS" "${COMMON[@]}" \
  --concurrency 1 --requests 8 --max-new-tokens 32
stop_cluster

if [ "${SWEEP:-1}" != 0 ]; then
  SPECD_BUILD="$BUILD" "$ROOT/loadtest/sweep.sh" "$OUT" >&2
fi

"$PYTHON" - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
def point(name):
    return json.load(open(os.path.join(out, name + ".json")))["points"][0]
ct, it = point("cluster_throughput"), point("inproc_throughput")
c1, i1 = point("cluster_batch1"), point("inproc_batch1")
for p in (ct, it, c1, i1):
    if p["ok"] != p["requests"]:
        print(f"cluster_bench: {p['requests'] - p['ok']} requests failed: {p['errors_by_code']}")
ratio = ct["throughput_tokens_per_s"] / it["throughput_tokens_per_s"]
added = c1["itl_ms"]["p50"] - i1["itl_ms"]["p50"]
ttft = c1["ttft_ms"]["p50"]
print("| what | in-process | cluster | result | goal |")
print("|---|---|---|---|---|")
print(f"| throughput, 4 clients, 64-token prompts, 32 new tokens | "
      f"{it['throughput_tokens_per_s']:.1f} tok/s | {ct['throughput_tokens_per_s']:.1f} tok/s | "
      f"{ratio:.2f}x | >= 0.85x ({'met' if ratio >= 0.85 else 'missed'}) |")
print(f"| inter-token latency p50, 1 client | {i1['itl_ms']['p50']:.2f} ms | "
      f"{c1['itl_ms']['p50']:.2f} ms | {added:+.2f} ms | <= +1 ms ({'met' if added <= 1 else 'missed'}) |")
print(f"| TTFT p50, 64-token prompt, 1 client | {i1['ttft_ms']['p50']:.0f} ms | {ttft:.0f} ms | "
      f"{ttft:.0f} ms | < 100 ms ({'met' if ttft < 100 else 'missed'}) |")
if os.path.exists(os.path.join(out, "latency_vs_qps.png")):
    print(f"latency vs QPS: {os.path.join(out, 'latency_vs_qps.png')}")
EOF
