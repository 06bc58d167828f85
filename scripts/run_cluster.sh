#!/usr/bin/env bash
# Local launcher: starts specd-target, specd-draft and specd-router on this machine (internal
# hops over Unix sockets, the router on TCP), waits until all three answer gRPC health, and
# stops them cleanly (SIGTERM, then SIGKILL after a grace period) on exit or Ctrl-C.
#
#   scripts/run_cluster.sh [options]                 # serve until Ctrl-C
#   scripts/run_cluster.sh --prompt "Hello" [-n 64]  # start, answer one prompt, stop
#
# Options (environment variables in brackets):
#   --build DIR          build directory with services/ and tools/ [SPECD_BUILD, default build]
#   --model FILE         target GGUF [SPECD_MODEL, default models/SmolLM2-135M-Instruct.Q4_1.gguf]
#   --draft-model FILE   draft GGUF, or "default" (the distilled draft shipped for the target:
#                        drafts/<target file stem>.draft.gguf, made by tools/distill; "self" when
#                        there is none), "self" (the target's first --draft-layers layers), or
#                        "none" [SPECD_DRAFT_MODEL, default default]
#   --draft-layers N     layers of a self draft [default 8]
#   --port P             router TCP port [SPECD_PORT, default 50051]
#   --metrics-port P     router metrics port; target/draft use P+1/P+2 [default 9090]
#   --http-port P        the router's OpenAI-compatible HTTP API [SPECD_HTTP_PORT, default 8000;
#                        0 = off; empty: the flag is not passed, for binaries without it]
#   --bind ADDR          address the router's gRPC and HTTP ports and every /metrics bind
#                        [SPECD_BIND, default 127.0.0.1: this machine only; 0.0.0.0 exposes
#                        them; empty: the binaries' own defaults]
#   --threads N          CPU threads for each model service [default: all cores — the router
#                        runs the draft step and then the target step, never both at once]
#   --prompt TEXT        answer this prompt through the cluster (chat template), then stop
#   -n N                 max new tokens for --prompt [default 64]
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${SPECD_BUILD:-$ROOT/build}"
MODEL="${SPECD_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
DRAFT_MODEL="${SPECD_DRAFT_MODEL:-default}"
DRAFT_LAYERS=8
PORT="${SPECD_PORT:-50051}"
METRICS_PORT=9090
HTTP_PORT="${SPECD_HTTP_PORT:-8000}"
BIND="${SPECD_BIND-127.0.0.1}"
THREADS=$(nproc)
PROMPT=""
N=64
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --draft-model) DRAFT_MODEL="$2"; shift 2 ;;
    --draft-layers) DRAFT_LAYERS="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --metrics-port) METRICS_PORT="$2"; shift 2 ;;
    --http-port) HTTP_PORT="$2"; shift 2 ;;
    --bind) BIND="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --prompt) PROMPT="$2"; shift 2 ;;
    -n) N="$2"; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "run_cluster: unknown option $1" >&2; exit 2 ;;
  esac
done

for b in services/specd-target services/specd-draft services/specd-router tools/specd; do
  [ -x "$BUILD/$b" ] || { echo "run_cluster: $BUILD/$b missing (build first)" >&2; exit 1; }
done
[ -f "$MODEL" ] || { echo "run_cluster: model $MODEL missing (scripts/fetch_model.sh)" >&2; exit 1; }

RUN="$(mktemp -d /tmp/specd-cluster.XXXXXX)"
PIDS=()
stop() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for _ in $(seq 1 100); do
    alive=0
    for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$RUN"
}
trap stop EXIT
trap 'exit 130' INT TERM

wait_healthy() {  # address, name, pid
  for _ in $(seq 1 600); do
    if "$BUILD/tools/specd" client health --server "$1" --timeout 1 >/dev/null 2>&1; then return 0; fi
    kill -0 "$3" 2>/dev/null || { echo "run_cluster: $2 exited; log:" >&2; cat "$RUN/$2.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "run_cluster: $2 not healthy after 60 s" >&2
  exit 1
}

TARGET="unix:$RUN/target.sock"
"$BUILD/services/specd-target" --listen "$TARGET" --model "$MODEL" --threads "$THREADS" \
  --metrics-port $((METRICS_PORT + 1)) ${BIND:+--metrics-address "$BIND"} \
  >"$RUN/target.log" 2>&1 &
PIDS+=($!); TPID=$!
# The target times its forwards at start-up (the adaptive-k calibration): let it have the
# cores alone, then start the draft, which calibrates in turn.
wait_healthy "$TARGET" target "$TPID"
DRAFT_FLAG=()
if [ "$DRAFT_MODEL" != none ]; then
  DRAFT="unix:$RUN/draft.sock"
  if [ "$DRAFT_MODEL" = default ]; then
    shipped="$ROOT/drafts/$(basename "${MODEL%.gguf}").draft.gguf"
    if [ -f "$shipped" ]; then
      DRAFT_MODEL="$shipped"
    else
      echo "run_cluster: no shipped draft $shipped; drafting with the target's first $DRAFT_LAYERS layers" >&2
      DRAFT_MODEL=self
    fi
  fi
  if [ "$DRAFT_MODEL" = self ]; then
    DARGS=(--model "$MODEL" --layers "$DRAFT_LAYERS")
  else
    # A distilled draft borrows the target's token embeddings (and must share its vocabulary).
    DARGS=(--model "$DRAFT_MODEL" --borrow-from "$MODEL")
  fi
  "$BUILD/services/specd-draft" --listen "$DRAFT" "${DARGS[@]}" --threads "$THREADS" \
    --metrics-port $((METRICS_PORT + 2)) ${BIND:+--metrics-address "$BIND"} \
    >"$RUN/draft.log" 2>&1 &
  PIDS+=($!); DPID=$!
  DRAFT_FLAG=(--draft "$DRAFT")
fi
[ "$DRAFT_MODEL" != none ] && wait_healthy "$DRAFT" draft "$DPID"
"$BUILD/services/specd-router" --listen "${BIND:-0.0.0.0}:$PORT" --target "$TARGET" \
  "${DRAFT_FLAG[@]}" --model "$MODEL" --metrics-port "$METRICS_PORT" \
  ${BIND:+--metrics-address "$BIND"} ${HTTP_PORT:+--http-port "$HTTP_PORT"} \
  ${BIND:+${HTTP_PORT:+--http-address "$BIND"}} >"$RUN/router.log" 2>&1 &
PIDS+=($!); RPID=$!
wait_healthy "localhost:$PORT" router "$RPID"
echo "run_cluster: router on localhost:$PORT (metrics :$METRICS_PORT$([ "$HTTP_PORT" != 0 ] && echo ", OpenAI HTTP API :$HTTP_PORT")), logs in $RUN" >&2

if [ -n "$PROMPT" ]; then
  "$BUILD/tools/specd" client generate --server "localhost:$PORT" --chat -p "$PROMPT" -n "$N" \
    --temp 0
  exit $?
fi
wait "$RPID"
