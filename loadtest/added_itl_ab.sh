#!/usr/bin/env bash
# The inter-token latency the cluster adds at batch 1, two cluster configurations against the
# same engine in-process, interleaved per round so that a noisy host's drift lands on all three
# alike: each round runs REQUESTS requests (64-token prompts, 64 new tokens, speculation off)
# on cluster A, in-process, then cluster B, and the added ITL is each cluster's ITL p50 less
# that round's in-process p50. Prints every round, then the median and range of each.
#
#   loadtest/added_itl_ab.sh [OUT_DIR]
# Environment: A_ENV / B_ENV: environment assignments for each cluster's services
# [A_ENV="SPECD_POOL_SPIN_US=300" (the fixed spin before NextSpinBudget), B_ENV="" (adaptive)],
# ROUNDS [10], REQUESTS [4], SPECD_BUILD [build], THREADS per model service [all cores].
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/specd-added-itl}"
BUILD="${SPECD_BUILD:-$ROOT/build}"
THREADS="${THREADS:-$(nproc)}"
ROUNDS="${ROUNDS:-10}"
REQUESTS="${REQUESTS:-4}"
A_ENV="${A_ENV-SPECD_POOL_SPIN_US=300}"
B_ENV="${B_ENV-}"
MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
LOADTEST="$BUILD/loadtest/specd-loadtest"
[ -x "$LOADTEST" ] || { echo "added_itl_ab: $LOADTEST missing (build first)" >&2; exit 1; }
PYTHON="$("$ROOT/scripts/python_env.sh")"
mkdir -p "$OUT"
rm -f "$OUT"/[AIB]_*.json
# shellcheck source=loadtest/cluster_lib.sh
. "$ROOT/loadtest/cluster_lib.sh"

# Both clusters run side by side (the idle one's threads sleep), each started in a subshell
# with its own environment; the subshell reports its ports and waits on its launcher.
launch() {  # name, env assignments, pid file
  # shellcheck disable=SC2086,SC2163  # the assignments are words: KEY=VALUE ...
  (if [ -n "$2" ]; then export $2; fi
   start_cluster "$1" >&2
   echo "$PORT $CLUSTER" >"$3"
   trap - EXIT
   wait "$CLUSTER") &
}
await_pid_file() {  # one cluster at a time: free_port in parallel could hand both one port
  for _ in $(seq 1 1800); do [ -s "$1" ] && return 0; sleep 0.1; done
  echo "added_itl_ab: a cluster did not start" >&2
  exit 1
}
rm -f "$OUT/a.pid" "$OUT/b.pid"
launch added_itl_a "$A_ENV" "$OUT/a.pid"
await_pid_file "$OUT/a.pid"
launch added_itl_b "$B_ENV" "$OUT/b.pid"
await_pid_file "$OUT/b.pid"
read -r PORT_A CLUSTER_A <"$OUT/a.pid"
read -r PORT_B CLUSTER_B <"$OUT/b.pid"
rm -f "$OUT/a.pid" "$OUT/b.pid"
trap 'kill -TERM "$CLUSTER_A" "$CLUSTER_B" 2>/dev/null || true; wait 2>/dev/null || true' EXIT

COMMON=(--mode closed --prompts random --prompt-tokens 64 --spec off --concurrency 1)
for port in "$PORT_A" "$PORT_B"; do  # warm both (page cache, pools, streams)
  "$LOADTEST" --server "localhost:$port" "${COMMON[@]}" --requests 2 --max-new-tokens 4 >/dev/null
done
for r in $(seq 1 "$ROUNDS"); do
  "$LOADTEST" --server "localhost:$PORT_A" "${COMMON[@]}" --requests "$REQUESTS" \
    --max-new-tokens 64 --out "$OUT/A_$r.json" >/dev/null
  "$LOADTEST" --in-process-model "$MODEL" --threads "$THREADS" "${COMMON[@]}" \
    --requests "$REQUESTS" --max-new-tokens 64 --out "$OUT/I_$r.json" >/dev/null
  "$LOADTEST" --server "localhost:$PORT_B" "${COMMON[@]}" --requests "$REQUESTS" \
    --max-new-tokens 64 --out "$OUT/B_$r.json" >/dev/null
done

"$PYTHON" - "$OUT" "$ROUNDS" "$A_ENV" "$B_ENV" <<'PY'
import json, statistics, sys
out, n, a_env, b_env = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def itl(kind, r):
    p = json.load(open(f"{out}/{kind}_{r}.json"))["points"][0]
    if p["ok"] != p["requests"]:
        print(f"added_itl_ab: {kind} round {r}: {p['requests'] - p['ok']} requests failed")
    return p["itl_ms"]["p50"]
rounds = range(1, n + 1)
print("| round | A ITL p50 | in-process | B ITL p50 | A added | B added |")
print("|---|---|---|---|---|---|")
for r in rounds:
    a, i, b = itl("A", r), itl("I", r), itl("B", r)
    print(f"| {r} | {a:.3f} ms | {i:.3f} ms | {b:.3f} ms | {a - i:+.3f} | {b - i:+.3f} |")
for name, env, kind in (("A", a_env, "A"), ("B", b_env, "B")):
    added = [itl(kind, r) - itl("I", r) for r in rounds]
    print(f"{name} ({env or 'defaults'}): added ITL p50, median of {n} rounds "
          f"{statistics.median(added):+.3f} ms [{min(added):+.3f} .. {max(added):+.3f}]")
print("B - A, cluster ITL p50, median of rounds: "
      f"{statistics.median([itl('B', r) - itl('A', r) for r in rounds]):+.3f} ms")
PY
