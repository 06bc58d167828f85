#!/usr/bin/env bash
# The router hop, measured where it happens: per target step, the Step latency the router sees
# (specd_router_rpc_latency_seconds{hop="target"}) minus the step the target service timed
# (specd_service_step_latency_seconds), beside the batch-1 inter-token latency p50. Runs
# ROUNDS rounds, each a fresh cluster with unary Step calls (--step-streams=false) and then
# one with the long-lived StepStream, so the two compare inside one run.
#
#   loadtest/hop_cost.sh [OUT_DIR]
# Environment: SPECD_BUILD [build], THREADS per model service [all cores], ROUNDS [3],
# REQUESTS [16] of 64 new tokens each, speculation off.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/specd-hop-cost}"
BUILD="${SPECD_BUILD:-$ROOT/build}"
THREADS="${THREADS:-$(nproc)}"
ROUNDS="${ROUNDS:-3}"
REQUESTS="${REQUESTS:-16}"
LOADTEST="$BUILD/loadtest/specd-loadtest"
[ -x "$LOADTEST" ] || { echo "hop_cost: $LOADTEST missing (build first)" >&2; exit 1; }
PYTHON="${PYTHON:-$("$ROOT/scripts/python_env.sh")}"  # stdlib only: any python3 will do
mkdir -p "$OUT"
rm -f "$OUT/metrics.txt"
# shellcheck source=loadtest/cluster_lib.sh
. "$ROOT/loadtest/cluster_lib.sh"

sum_count() {  # metrics port, metric name prefix with labels -> "sum count"
  curl -s "localhost:$1/metrics" | "$PYTHON" -c '
import re, sys
want = sys.argv[1]
vals = {}
for line in sys.stdin:
    m = re.match(r"(\S+?)_(sum|count)(\{[^}]*\})? (\S+)", line)
    if m and (m.group(1) + (m.group(3) or "")) == want:
        vals[m.group(2)] = float(m.group(4))
print(vals.get("sum", 0), vals.get("count", 0))' "$2"
}

for round in $(seq 1 "$ROUNDS"); do
  for mode in unary stream socket; do
    name="r${round}_$mode"
    streams=true sockets=false
    [ "$mode" = unary ] && streams=false
    [ "$mode" = socket ] && sockets=true
    SPECD_ROUTER_STEP_STREAMS=$streams SPECD_ROUTER_STEP_SOCKETS=$sockets start_cluster hop_cost
    COMMON=(--server "localhost:$PORT" --mode closed --prompts random --prompt-tokens 64
            --spec off --concurrency 1)
    "$LOADTEST" "${COMMON[@]}" --requests 2 --max-new-tokens 4 >/dev/null  # warm-up
    "$LOADTEST" "${COMMON[@]}" --requests "$REQUESTS" --max-new-tokens 64 \
      --out "$OUT/$name.json" >/dev/null
    read -r rpc_sum rpc_n < <(sum_count "$METRICS_PORT" 'specd_router_rpc_latency_seconds{hop="target"}')
    read -r step_sum step_n < <(sum_count "$((METRICS_PORT + 1))" \
      'specd_service_step_latency_seconds{component="target"}')
    stop_cluster
    echo "$name $rpc_sum $rpc_n $step_sum $step_n" >>"$OUT/metrics.txt"
  done
done

"$PYTHON" - "$OUT" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
rows = {"unary": [], "stream": [], "socket": []}
for line in open(os.path.join(out, "metrics.txt")):
    name, rpc_sum, rpc_n, step_sum, step_n = line.split()
    mode = name.rsplit("_", 1)[1]
    # The service's sum also holds the router's prefix lookups (steps without sequences, a few
    # us of work each, which the router times under another hop): a negligible over-subtraction.
    hop_ms = (float(rpc_sum) - float(step_sum)) / float(rpc_n) * 1e3
    itl = json.load(open(os.path.join(out, name + ".json")))["points"][0]["itl_ms"]["p50"]
    rows[mode].append((hop_ms, itl))
    print(f"{name}: hop {hop_ms:.3f} ms per target step, ITL p50 {itl:.2f} ms")
for mode, label in (("unary", "unary Step"), ("stream", "StepStream"), ("socket", "step socket")):
    hops = [h for h, _ in rows[mode]]
    itls = [i for _, i in rows[mode]]
    print(f"{label}: hop median {statistics.median(hops):.3f} ms "
          f"[{min(hops):.3f}-{max(hops):.3f}], ITL p50 median {statistics.median(itls):.2f} ms "
          f"[{min(itls):.2f}-{max(itls):.2f}]")
PY
