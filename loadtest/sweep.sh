#!/usr/bin/env bash
# Latency vs offered load, with and without speculation: starts a local cluster
# (scripts/run_cluster.sh: SmolLM2 target, self-draft = its first 8 layers), runs an open-loop
# specd-loadtest QPS sweep once per speculation setting, and plots the JSONs with
# loadtest/plot.py (matplotlib from the .venv made by scripts/python_env.sh).
#
#   loadtest/sweep.sh [OUT_DIR]        # default docs/img
#
# Writes OUT_DIR/latency_vs_qps.png and OUT_DIR/latency_vs_qps_<spec>.json per setting.
# Environment (defaults in brackets):
#   SPECD_BUILD     build directory with services/, tools/ and loadtest/ [build]
#   QPS             comma-separated offered rates [0.5,1,2,4]
#   DURATION_S      seconds of arrivals per point; the point then waits for its requests [10]
#   PROMPTS         builtin (chat prompts of varied length) or random [builtin]
#   PROMPT_TOKENS   random prompts: length in tokens [32]
#   NEW_TOKENS      tokens generated per request (ignore_eos) [32]
#   SPECS           settings to compare, MODE or MODE:K (K = 0: adaptive) [off auto ngram]
#   THREADS         CPU threads per model service [1]
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/docs/img}"
BUILD="${SPECD_BUILD:-$ROOT/build}"
QPS="${QPS:-0.5,1,2,4}"
DURATION_S="${DURATION_S:-10}"
PROMPTS="${PROMPTS:-builtin}"
PROMPT_TOKENS="${PROMPT_TOKENS:-32}"
NEW_TOKENS="${NEW_TOKENS:-32}"
SPECS="${SPECS:-off auto ngram}"
THREADS="${THREADS:-1}"

[ -x "$BUILD/loadtest/specd-loadtest" ] || {
  echo "sweep: $BUILD/loadtest/specd-loadtest missing (build first)" >&2; exit 1; }
PYTHON="$("$ROOT/scripts/python_env.sh")"
mkdir -p "$OUT"
# shellcheck source=loadtest/cluster_lib.sh
. "$ROOT/loadtest/cluster_lib.sh"
start_cluster sweep

JSONS=()
for s in $SPECS; do
  mode="${s%%:*}"
  k=0
  name="$mode"
  if [ "$mode" != "$s" ]; then k="${s#*:}"; name="${mode}_k$k"; fi
  json="$OUT/latency_vs_qps_$name.json"
  echo "sweep: spec $mode k=$k, QPS $QPS, ${DURATION_S} s per point -> $json" >&2
  "$BUILD/loadtest/specd-loadtest" --server "localhost:$PORT" --qps-sweep "$QPS" \
    --duration-s "$DURATION_S" --prompts "$PROMPTS" --prompt-tokens "$PROMPT_TOKENS" --max-new-tokens "$NEW_TOKENS" \
    --spec "$mode" --k "$k" --out "$json"
  JSONS+=("$json")
done
"$PYTHON" "$ROOT/loadtest/plot.py" "$OUT/latency_vs_qps.png" "${JSONS[@]}"
"$PYTHON" "$ROOT/loadtest/plot.py" --table "${JSONS[@]}"
echo "sweep: wrote $OUT/latency_vs_qps.png" >&2
