#!/usr/bin/env bash
# One command for a newcomer on a fresh Debian machine: installs dependencies, builds,
# fetches the default model and runs the main job: a local cluster (router + draft + target)
# answering a prompt with speculative decoding.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
scripts/fetch_model.sh
scripts/build.sh
PROMPT=${1:-"What is speculative decoding? Answer in two sentences."}
# sed, not head: head would close the pipe early and, under pipefail, the inspector's SIGPIPE
# would end this script before the cluster answers.
build/tools/specd-inspect models/SmolLM2-135M-Instruct.Q4_1.gguf | sed -n '1,24p' 
scripts/run_cluster.sh --prompt "$PROMPT" -n 96
