#!/usr/bin/env bash
# The README's first command, checked: runs scripts/setup.sh with a prompt (on a machine where
# scripts/test.sh already installed and built everything, only the cluster part does work) and
# fails unless it exits 0 and the cluster's answer came back (the client prints the generated
# text, then a statistics line starting with "[").
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPT="What is speculative decoding? Answer in two sentences."
LOG="$(mktemp /tmp/specd-main-job.XXXXXX)"
trap 'rm -f "$LOG"' EXIT
if ! scripts/setup.sh "$PROMPT" >"$LOG" 2>&1; then
  echo "check_main_job: scripts/setup.sh failed (exit $?):" >&2
  cat "$LOG" >&2
  exit 1
fi
cat "$LOG"
# The answer: what the client printed between the router's start line and its statistics.
ANSWER="$(sed -n '/^run_cluster: router on/,$p' "$LOG" | sed '1d' | grep -v '^\[' | tr -d '[:space:]')"
if [ -z "$ANSWER" ]; then
  echo "check_main_job: the cluster printed no answer" >&2
  exit 1
fi
echo "check_main_job: the cluster answered (${#ANSWER} non-space characters)"
