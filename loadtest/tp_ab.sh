#!/usr/bin/env bash
# Tensor parallelism through a router: the default model's target as 3 rank processes (Gloo
# over loopback), as 3 thread ranks in one process, and as one rank, in one run, alternating
# ROUNDS times: closed-loop tokens/s and ITL p50 at CONCURRENCY (speculation off, greedy).
# Usage: loadtest/tp_ab.sh [OUT_DIR]   env: ROUNDS (2), REQUESTS (12), CONCURRENCY (4),
# THREADS (threads per rank, 1), BUILD (build)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
OUT=${1:-$(mktemp -d)}
ROUNDS=${ROUNDS:-2} REQUESTS=${REQUESTS:-12} CONCURRENCY=${CONCURRENCY:-4} THREADS=${THREADS:-1}
MODEL=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap stop_all EXIT

run_mode() {  # mode round
  local mode=$1 round=$2 tport rport rdv
  tport=$(free_port) rport=$(free_port) rdv=127.0.0.1:$(free_port)
  local base=("$BUILD/services/specd-target" --listen "127.0.0.1:$tport" --model "$MODEL"
              --threads "$THREADS" --calibrate=false)
  case $mode in
    processes)
      for r in 0 1 2; do
        "${base[@]}" --world-size 3 --rank $r --rendezvous "$rdv" >"$OUT/$mode-$round-rank$r.log" 2>&1 &
        PIDS+=($!)
      done ;;
    threads) "${base[@]}" --world-size 3 >"$OUT/$mode-$round-target.log" 2>&1 & PIDS+=($!) ;;
    one) "${base[@]}" >"$OUT/$mode-$round-target.log" 2>&1 & PIDS+=($!) ;;
  esac
  "$BUILD/services/specd-router" --listen "127.0.0.1:$rport" --target "127.0.0.1:$tport" \
    --model "$MODEL" >"$OUT/$mode-$round-router.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 600); do
    "$BUILD/tools/specd" client health --server "127.0.0.1:$rport" --timeout 1 >/dev/null 2>&1 && break
    sleep 0.2
  done
  "$BUILD/loadtest/specd-loadtest" --server "127.0.0.1:$rport" --mode closed \
    --concurrency "$CONCURRENCY" --requests "$REQUESTS" --max-new-tokens 64 --spec off \
    >"$OUT/$mode-$round.json" 2>"$OUT/$mode-$round.err"
  stop_all
  "$PYTHON" - "$OUT/$mode-$round.json" "$mode" "$round" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = d["points"][0] if "points" in d else d
print(f"{sys.argv[2]:>9} round {sys.argv[3]}: {r['throughput_tokens_per_s']:.1f} tok/s, "
      f"ITL p50 {r['itl_ms']['p50']:.1f} ms, errors {r['errors_by_code']}")
PY
}

for round in $(seq 1 "$ROUNDS"); do
  for mode in processes threads one; do run_mode $mode $round; done
done | tee "$OUT/summary.txt"
