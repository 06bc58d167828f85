#!/usr/bin/env bash
# One speculative step through the cluster, as a timeline: at concurrency 1 with drafting
# forced (--spec draft --k K), the means per step of what the router's metrics and each
# service's own step timer (/metrics) saw: the draft round trip and the draft service's step
# inside it, the target round trip and the target's step (verification of k+1 rows) inside it,
# and the router's own work between steps (the step's time per the clients' inter-token
# latency, less both round trips). The hops are the round trips less the services' steps.
#
#   loadtest/step_timeline.sh [OUT_DIR]
# Environment: SPECD_BUILD [build], THREADS per model service [all cores], K [3], REQUESTS [8]
# of 64 new tokens each.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/specd-step-timeline}"
BUILD="${SPECD_BUILD:-$ROOT/build}"
THREADS="${THREADS:-$(nproc)}"
K="${K:-3}"
REQUESTS="${REQUESTS:-8}"
LOADTEST="$BUILD/loadtest/specd-loadtest"
[ -x "$LOADTEST" ] || { echo "step_timeline: $LOADTEST missing (build first)" >&2; exit 1; }
PYTHON="$("$ROOT/scripts/python_env.sh")"
mkdir -p "$OUT"
# shellcheck source=loadtest/cluster_lib.sh
. "$ROOT/loadtest/cluster_lib.sh"

start_cluster step_timeline
COMMON=(--server "localhost:$PORT" --mode closed --spec draft --k "$K" --concurrency 1)
"$LOADTEST" "${COMMON[@]}" --requests 2 --max-new-tokens 4 >/dev/null  # warm-up
for p in "$METRICS_PORT" "$((METRICS_PORT + 1))" "$((METRICS_PORT + 2))"; do
  curl -s "localhost:$p/metrics" >"$OUT/before_$p.txt"
done
"$LOADTEST" "${COMMON[@]}" --requests "$REQUESTS" --max-new-tokens 64 --out "$OUT/load.json" >/dev/null
for p in "$METRICS_PORT" "$((METRICS_PORT + 1))" "$((METRICS_PORT + 2))"; do
  curl -s "localhost:$p/metrics" >"$OUT/after_$p.txt"
done
stop_cluster

"$PYTHON" - "$OUT" "$METRICS_PORT" "$K" <<'PY'
import os, re, sys
out, port, k = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def read(name):
    vals = {}
    for line in open(os.path.join(out, name)):
        m = re.match(r"(\S+?)_(sum|count)(\{[^}]*\})? (\S+)", line)
        if m:
            vals[(m.group(1) + (m.group(3) or ""), m.group(2))] = float(m.group(4))
    return vals

def mean(p, metric):  # (sum, count) of what the load run added
    a, b = read(f"after_{p}.txt"), read(f"before_{p}.txt")
    s = a.get((metric, "sum"), 0) - b.get((metric, "sum"), 0)
    n = a.get((metric, "count"), 0) - b.get((metric, "count"), 0)
    return s / n if n else float("nan"), n

itl, _ = mean(port, "specd_router_inter_token_latency_seconds")
per_step, steps = mean(port, "specd_router_accepted_length_tokens")
draft_rpc, _ = mean(port, 'specd_router_rpc_latency_seconds{hop="draft"}')
target_rpc, _ = mean(port, 'specd_router_rpc_latency_seconds{hop="target"}')
target_step, _ = mean(port + 1, 'specd_service_step_latency_seconds{component="target"}')
draft_step, _ = mean(port + 2, 'specd_service_step_latency_seconds{component="draft"}')
step = itl * per_step
ms = lambda x: f"{x * 1e3:7.3f} ms"
print(f"one speculative step, concurrency 1, k {k}: {steps:.0f} verification steps, "
      f"{per_step:.2f} tokens a step, ITL mean {itl * 1e3:.2f} ms")
print(f"  router, between steps (schedule, plan, emit) {ms(step - draft_rpc - target_rpc)}")
print(f"  draft hop (round trip less the step)         {ms(draft_rpc - draft_step)}")
print(f"  draft service step ({k} rounds)                {ms(draft_step)}")
print(f"  target hop (round trip less the step)        {ms(target_rpc - target_step)}")
print(f"  target service step (verify {int(k) + 1} rows)          {ms(target_step)}")
print(f"  the step (ITL mean x tokens a step)          {ms(step)}")
PY
