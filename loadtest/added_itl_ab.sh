#!/usr/bin/env bash
# The inter-token latency the cluster adds at batch 1, two cluster configurations against the
# same engine in-process, interleaved per round so that a noisy host's drift lands on all three
# alike: each round runs REQUESTS requests (64-token prompts, 64 new tokens, speculation off)
# on one cluster, in-process, then the other cluster, and the added ITL is each cluster's ITL p50 less
# that round's in-process p50. Prints every round, then the median and range of each.
#
#   loadtest/added_itl_ab.sh [OUT_DIR]
# Environment: A_ENV / B_ENV: NAME=VALUE words for each cluster's processes [A_ENV: the
# defaults before the router-hop work, "SPECD_POOL_SPIN_US=300 GRPC_POLL_STRATEGY=epoll1";
# B_ENV="": today's defaults],
# ROUNDS [10], REQUESTS [4], SPECD_BUILD [build], THREADS per model service [all cores].
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/specd-added-itl}"
BUILD="${SPECD_BUILD:-$ROOT/build}"
THREADS="${THREADS:-$(nproc)}"
ROUNDS="${ROUNDS:-10}"
REQUESTS="${REQUESTS:-4}"
A_ENV="${A_ENV-SPECD_POOL_SPIN_US=300 GRPC_POLL_STRATEGY=epoll1}"
B_ENV="${B_ENV-}"
MODEL="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf"
LOADTEST="$BUILD/loadtest/specd-loadtest"
[ -x "$LOADTEST" ] || { echo "added_itl_ab: $LOADTEST missing (build first)" >&2; exit 1; }
PYTHON="$("$ROOT/scripts/python_env.sh")"
mkdir -p "$OUT"
rm -f "$OUT"/[AIB]_*.json
# shellcheck source=loadtest/cluster_lib.sh
. "$ROOT/loadtest/cluster_lib.sh"

# Both clusters run side by side (the idle one's threads sleep), started one after the other
# (free_port could hand two clusters starting at once the same port). Each gets only its own
# settings: a caller's SPECD_POOL_SPIN_US / GRPC_POLL_STRATEGY reach neither, nor the
# in-process baseline.
unset SPECD_HTTP_PORT  # each router picks a free HTTP port
CLEAN=(-u SPECD_POOL_SPIN_US -u GRPC_POLL_STRATEGY)
read -r -a A_SET <<<"$A_ENV"
read -r -a B_SET <<<"$B_ENV"
for kv in ${A_SET[@]+"${A_SET[@]}"} ${B_SET[@]+"${B_SET[@]}"}; do
  [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "added_itl_ab: '$kv' is not NAME=VALUE" >&2; exit 2; }
done
CLUSTER_ENV=("${CLEAN[@]}" ${A_SET[@]+"${A_SET[@]}"})
start_cluster added_itl_a
PORT_A=$PORT
ALSO_STOP=$CLUSTER  # a failed start of B, or any exit from here on, stops A as well
CLUSTER_ENV=("${CLEAN[@]}" ${B_SET[@]+"${B_SET[@]}"})
start_cluster added_itl_b
PORT_B=$PORT

COMMON=(--mode closed --prompts random --prompt-tokens 64 --spec off --concurrency 1)
for port in "$PORT_A" "$PORT_B"; do  # warm both (page cache, pools, streams)
  "$LOADTEST" --server "localhost:$port" "${COMMON[@]}" --requests 2 --max-new-tokens 4 >/dev/null
done
cluster_run() {  # A|B, port, round
  "$LOADTEST" --server "localhost:$2" "${COMMON[@]}" --requests "$REQUESTS" \
    --max-new-tokens 64 --out "$OUT/$1_$3.json" >/dev/null
}
for r in $(seq 1 "$ROUNDS"); do
  # A, in-process, B in odd rounds and B, in-process, A in even ones: a position's effect
  # (caches, the host's drift within a round) lands on both clusters alike.
  if (( r % 2 )); then cluster_run A "$PORT_A" "$r"; else cluster_run B "$PORT_B" "$r"; fi
  env "${CLEAN[@]}" "$LOADTEST" --in-process-model "$MODEL" --threads "$THREADS" "${COMMON[@]}" \
    --requests "$REQUESTS" --max-new-tokens 64 --out "$OUT/I_$r.json" >/dev/null
  if (( r % 2 )); then cluster_run B "$PORT_B" "$r"; else cluster_run A "$PORT_A" "$r"; fi
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
