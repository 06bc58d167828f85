#!/usr/bin/env bash
# The OpenAI HTTP face against gRPC, in one run on one local cluster (scripts/run_cluster.sh):
#   1. batch 1 (1 client, greedy, speculation off): TTFT / ITL / e2e p50 over gRPC and HTTP,
#      alternating, ROUNDS rounds each — what the HTTP face adds;
#   2. CONNS concurrent streamed HTTP requests (short outputs): requests lost, errors by HTTP
#      status (429 is the queue refusing on purpose), the router's peak RSS.
# Prints a summary table; JSONs go to OUT_DIR (default /tmp/specd-http-vs-grpc).
#
#   loadtest/http_vs_grpc.sh [OUT_DIR]
# Environment: SPECD_BUILD [build], THREADS per model service [all cores], ROUNDS [3],
# REQUESTS per batch-1 point [16], NEW_TOKENS [64], CONNS [1000], CONN_TOKENS [16].
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/specd-http-vs-grpc}"
BUILD="${SPECD_BUILD:-$ROOT/build}"
THREADS="${THREADS:-$(nproc)}"
LOADTEST="$BUILD/loadtest/specd-loadtest"
[ -x "$LOADTEST" ] || { echo "http_vs_grpc: $LOADTEST missing (build first)" >&2; exit 1; }
PYTHON="$("$ROOT/scripts/python_env.sh")"
mkdir -p "$OUT"
CONNS="${CONNS:-1000}"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true  # the load tool holds one socket per client
# The queue must hold every client of part 2 (a refusal would be a deliberate 429).
export SPECD_ROUTER_MAX_QUEUE="${SPECD_ROUTER_MAX_QUEUE:-$((CONNS + 64))}"
# shellcheck source=loadtest/cluster_lib.sh
. "$ROOT/loadtest/cluster_lib.sh"
start_cluster http_vs_grpc
ROUTER_PID="$(pgrep -n -f "specd-router --listen [^ ]*:$PORT")"

B1=(--mode closed --concurrency 1 --requests "${REQUESTS:-16}" --prompts builtin
    --max-new-tokens "${NEW_TOKENS:-64}" --temperature 0 --spec off)
"$LOADTEST" --server "localhost:$PORT" "${B1[@]}" --requests 2 >/dev/null  # warm-up
for r in $(seq 1 "${ROUNDS:-3}"); do
  echo "http_vs_grpc: batch 1, round $r" >&2
  "$LOADTEST" --server "localhost:$PORT" "${B1[@]}" --out "$OUT/grpc_$r.json"
  "$LOADTEST" --server "localhost:$PORT" --http "localhost:$HTTP_PORT" "${B1[@]}" \
    --out "$OUT/http_$r.json"
done

echo "http_vs_grpc: $CONNS concurrent HTTP streams" >&2
rss_before=$(awk '/VmRSS/ {print $2}' "/proc/$ROUTER_PID/status")
"$LOADTEST" --server "localhost:$PORT" --http "localhost:$HTTP_PORT" --mode closed \
  --concurrency "$CONNS" --requests "$CONNS" --prompts builtin \
  --max-new-tokens "${CONN_TOKENS:-16}" --temperature 0 --spec auto \
  --out "$OUT/http_conns.json" 2>"$OUT/http_conns.err" &
LT=$!
peak=$rss_before
while kill -0 "$LT" 2>/dev/null; do
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$ROUTER_PID/status" 2>/dev/null || echo 0)
  [ "$rss" -gt "$peak" ] && peak=$rss
  sleep 0.2
done
wait "$LT"
rss_after=$(awk '/VmRSS/ {print $2}' "/proc/$ROUTER_PID/status")
stop_cluster

"$PYTHON" - "$OUT" "${ROUNDS:-3}" "$CONNS" "$rss_before" "$peak" "$rss_after" <<'PY'
import json, statistics, sys
out, rounds, conns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rss = [int(x) / 1024 for x in sys.argv[4:7]]
def load(name):
    return json.load(open(f"{out}/{name}.json"))["points"][0]
rows = {k: [load(f"{k}_{r}") for r in range(1, rounds + 1)] for k in ("grpc", "http")}
print("| figure (batch 1, p50) | gRPC per round | HTTP per round | HTTP - gRPC (median) |")
print("|---|---|---|---|")
for key, label in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "e2e")):
    g = [p[key]["p50"] for p in rows["grpc"]]
    h = [p[key]["p50"] for p in rows["http"]]
    d = statistics.median(hh - gg for gg, hh in zip(g, h))
    print(f"| {label} | {', '.join(f'{x:.2f}' for x in g)} ms | "
          f"{', '.join(f'{x:.2f}' for x in h)} ms | {d:+.2f} ms |")
p = load("http_conns")
lost = conns - p["requests"]
print(f"\n{conns} concurrent HTTP streams: {p['requests']} answered, {p['ok']} ok, "
      f"errors by HTTP status {p['errors_by_code']}, lost {lost}; "
      f"TTFT p50 {p['ttft_ms']['p50']:.0f} ms, p99 {p['ttft_ms']['p99']:.0f} ms; "
      f"e2e p99 {p['e2e_ms']['p99']:.0f} ms; {p['throughput_tokens_per_s']:.0f} tok/s")
print(f"router RSS: {rss[0]:.0f} MiB before, {rss[1]:.0f} MiB peak, {rss[2]:.0f} MiB after")
bad = {k: v for k, v in p["errors_by_code"].items() if k != "429"}
sys.exit(1 if lost or bad else 0)
PY
