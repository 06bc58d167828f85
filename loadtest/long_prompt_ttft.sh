#!/usr/bin/env bash
# Long prompts through the cluster (issue 18): time to first token for LONG-token prompts
# (random token ids, so no prefix-cache hits), first alone and then while other requests
# decode (builtin chat prompts, BACKGROUND clients, long outputs, no speculation); with the
# inter-token latency those decoding requests see meanwhile, against their ITL alone. The cluster is scripts/run_cluster.sh's
# default (the shipped draft, speculation auto). JSONs go to OUT_DIR.
#
#   loadtest/long_prompt_ttft.sh [OUT_DIR]
# Environment: SPECD_BUILD [build], THREADS per model service [all cores], LONG [1700],
# REQUESTS long prompts per phase [4], BACKGROUND decoding clients [2], LONG_SPEC the long
# prompts' speculation mode [auto].
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/specd-long-prompt}"
BUILD="${SPECD_BUILD:-$ROOT/build}"
THREADS="${THREADS:-$(nproc)}"
LONG="${LONG:-1700}"
LONG_SPEC="${LONG_SPEC:-auto}"
REQUESTS="${REQUESTS:-4}"
BACKGROUND="${BACKGROUND:-2}"
LOADTEST="$BUILD/loadtest/specd-loadtest"
[ -x "$LOADTEST" ] || { echo "long_prompt_ttft: $LOADTEST missing (build first)" >&2; exit 1; }
PYTHON="$("$ROOT/scripts/python_env.sh")"
mkdir -p "$OUT"
# shellcheck source=loadtest/cluster_lib.sh
. "$ROOT/loadtest/cluster_lib.sh"
start_cluster long_prompt_ttft

LONG_FLAGS=(--server "localhost:$PORT" --mode closed --prompts random --prompt-tokens "$LONG"
            --concurrency 1 --requests "$REQUESTS" --max-new-tokens 4 --spec "$LONG_SPEC")
# Warm-up: page cache, thread pools, the draft's first prefill.
"$LOADTEST" --server "localhost:$PORT" --mode closed --prompts random --prompt-tokens 64 \
  --concurrency 1 --requests 2 --max-new-tokens 4 >/dev/null

echo "long_prompt_ttft: $REQUESTS prompts of $LONG tokens, alone" >&2
"$LOADTEST" "${LONG_FLAGS[@]}" --prompt-seed 1000 --out "$OUT/long_alone.json"

echo "long_prompt_ttft: the same while $BACKGROUND clients decode" >&2
# Enough decoding work to outlast the long prompts (~4 s of output per request a client).
"$LOADTEST" --server "localhost:$PORT" --mode closed --prompts builtin \
  --concurrency "$BACKGROUND" --requests $((BACKGROUND * REQUESTS)) --max-new-tokens 256 \
  --spec off --out "$OUT/background_loaded.json" &
BG=$!
sleep 3  # the background requests are decoding
scrape_router_metrics "$OUT/router_metrics_before.txt"
"$LOADTEST" "${LONG_FLAGS[@]}" --prompt-seed 2000 --out "$OUT/long_loaded.json"
scrape_router_metrics "$OUT/router_metrics_after.txt"  # the steps while the long prompts went in
wait "$BG"

echo "long_prompt_ttft: the background alone (no long prompts), for its ITL baseline" >&2
"$LOADTEST" --server "localhost:$PORT" --mode closed --prompts builtin \
  --concurrency "$BACKGROUND" --requests $((BACKGROUND * REQUESTS)) --max-new-tokens 256 \
  --spec off --out "$OUT/background_alone.json"

PYTHONPATH="$ROOT/loadtest" "$PYTHON" - "$OUT" "$LONG" "$BACKGROUND" <<'EOF'
import json, os, sys
import metrics_delta
out, long_tokens, bg = sys.argv[1], sys.argv[2], sys.argv[3]
load = lambda name: json.load(open(os.path.join(out, name)))["points"][0]
alone, loaded = load("long_alone.json"), load("long_loaded.json")
bg_loaded, bg_alone = load("background_loaded.json"), load("background_alone.json")
t = lambda j: f"p50 {j['ttft_ms']['p50']:.0f} ms, p90 {j['ttft_ms']['p90']:.0f} ms"
i = lambda j: f"p50 {j['itl_ms']['p50']:.1f} ms, p99 {j['itl_ms']['p99']:.1f} ms"
print(f"TTFT of a {long_tokens}-token prompt, alone:             {t(alone)} (target p50 <= 1000 ms)")
print(f"TTFT of a {long_tokens}-token prompt, {bg} clients decoding: {t(loaded)}")
print(f"ITL of the {bg} decoding clients, long prompts arriving: {i(bg_loaded)}")
print(f"ITL of the {bg} decoding clients, nothing else:          {i(bg_alone)}")
# The router's view of the long prompts' steps: the histograms' growth over the loaded phase.
grown = metrics_delta.delta(os.path.join(out, "router_metrics_before.txt"),
                            os.path.join(out, "router_metrics_after.txt"))
quantile = metrics_delta.quantile
bound = metrics_delta.read(os.path.join(out, "router_metrics_after.txt")).get(
    "specd_router_step_bound_seconds", 0.0)
mixed = metrics_delta.histogram(grown, "specd_router_mixed_step_seconds")
ratio = metrics_delta.histogram(grown, "specd_router_step_cost_ratio", 'stage="target"')
if mixed.get("count"):
    print(f"router: {mixed['count']:.0f} steps took prompt tokens beside decoders, mean "
          f"{1e3 * mixed['sum'] / mixed['count']:.1f} ms, p50 <= {1e3 * quantile(mixed, 0.5):.0f} ms, "
          f"p99 <= {1e3 * quantile(mixed, 0.99):.0f} ms (bound {1e3 * bound:.0f} ms)")
if ratio.get("count"):
    print(f"router: step seconds measured / predicted over {ratio['count']:.0f} steps: mean "
          f"{ratio['sum'] / ratio['count']:.2f}, p50 <= {quantile(ratio, 0.5):g}, "
          f"p90 <= {quantile(ratio, 0.9):g}")
errors = sum(sum(j["errors_by_code"].values()) for j in (alone, loaded, bg_loaded, bg_alone))
print(f"failed requests: {errors}")
EOF
