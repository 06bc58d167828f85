#!/usr/bin/env bash
# Prefix caching on vs off through the cluster, in one run: starts scripts/run_cluster.sh with
# the services' caches on, runs three workloads, then again with them off
# (SPECD_TARGET_PREFIX_CACHING / SPECD_DRAFT_PREFIX_CACHING=false), and prints on / off.
#   shared:    one random 1,000-token prefix + 20 tokens of its own per request, one at a time
#              (TTFT of a repeated long prefix);
#   multiturn: a shared ~500-token system prompt and a growing history per conversation
#              (specd-loadtest --prompts multiturn), 4 conversations at once;
#   unshared:  random 500-token prompts with nothing in common, 4 at once (what the cache costs
#              when it cannot help).
#
#   loadtest/prefix_cache_ab.sh [OUT_DIR]
# Environment: SPECD_BUILD [build], THREADS per model service [all cores], REQUESTS [12],
# SPEC (speculation mode) [off], WORKLOADS ["shared multiturn unshared"], ROUNDS of on/off
# cluster pairs [1] (the table averages them).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/specd-prefix-ab}"
BUILD="${SPECD_BUILD:-$ROOT/build}"
THREADS="${THREADS:-$(nproc)}"
LOADTEST="$BUILD/loadtest/specd-loadtest"
[ -x "$LOADTEST" ] || { echo "prefix_cache_ab: $LOADTEST missing (build first)" >&2; exit 1; }
PYTHON="$("$ROOT/scripts/python_env.sh")"
mkdir -p "$OUT"
N="${REQUESTS:-12}"
# shellcheck source=loadtest/cluster_lib.sh
. "$ROOT/loadtest/cluster_lib.sh"

WORKLOADS="${WORKLOADS:-shared multiturn unshared}"
for round in $(seq 1 "${ROUNDS:-1}"); do
  for cache in on off; do
    flag=true
    [ "$cache" = off ] && flag=false
    export SPECD_TARGET_PREFIX_CACHING="$flag" SPECD_DRAFT_PREFIX_CACHING="$flag"
    start_cluster "prefix_cache_ab ($cache)"
    COMMON=(--server "localhost:$PORT" --mode closed --spec "${SPEC:-off}" --temperature 0)
    for w in $WORKLOADS; do
      echo "prefix_cache_ab: round $round, cache $cache: $w" >&2
      case "$w" in
        shared) ARGS=(--prompts random --shared-prefix-tokens 1000 --prompt-tokens 20
                      --max-new-tokens 8 --concurrency 1 --requests "$N") ;;
        multiturn) ARGS=(--prompts multiturn --conversations 4 --max-new-tokens 32
                         --concurrency 4 --requests $((2 * N))) ;;
        unshared) ARGS=(--prompts random --prompt-tokens 500 --max-new-tokens 32
                        --concurrency 4 --requests "$N") ;;
        *) echo "prefix_cache_ab: unknown workload $w" >&2; exit 2 ;;
      esac
      "$LOADTEST" "${COMMON[@]}" "${ARGS[@]}" --out "$OUT/${w}_${cache}_${round}.json"
    done
    stop_cluster
  done
done

"$PYTHON" - "$OUT" "$WORKLOADS" <<'PY'
import glob, json, os, sys
out, workloads = sys.argv[1], sys.argv[2].split()
def points(name, cache):
    ps = []
    for f in sorted(glob.glob(os.path.join(out, f"{name}_{cache}_*.json"))):
        p = json.load(open(f))["points"][0]
        if p["ok"] != p["requests"]:
            print(f"prefix_cache_ab: {f}: {p['requests'] - p['ok']} requests failed")
        ps.append(p)
    return ps
def mean(v):
    return sum(v) / len(v)
print("| workload | rounds | TTFT p50 on / off ms | TTFT p99 on / off ms | TTFT p50 off / on | tok/s on / off | on / off |")
print("|---|---|---|---|---|---|---|")
for name in workloads:
    on, off = points(name, "on"), points(name, "off")
    p50 = {k: mean([p["ttft_ms"]["p50"] for p in v]) for k, v in (("on", on), ("off", off))}
    p99 = {k: mean([p["ttft_ms"]["p99"] for p in v]) for k, v in (("on", on), ("off", off))}
    tps = {k: mean([p["throughput_tokens_per_s"] for p in v]) for k, v in (("on", on), ("off", off))}
    print(f"| {name} | {len(on)} | {p50['on']:.0f} / {p50['off']:.0f} | {p99['on']:.0f} / {p99['off']:.0f} "
          f"| {p50['off'] / p50['on']:.2f}x | {tps['on']:.1f} / {tps['off']:.1f} | {tps['on'] / tps['off']:.2f}x |")
PY
