#!/usr/bin/env bash
# tools/device_check/draft_travel.sh carry|restore
# carry:   untrack and ignore the shipped draft, so that it travels to the device machine only
#          where a call names it in `carry` (each call may send 64 MiB, the working tree counted).
# restore: track it again as committed and drop the ignore line. Run before any commit.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf
case "${1:-}" in
  carry) git rm -q --cached "$D"; echo "/$D" >> .git/info/exclude ;;
  restore) sed -i "\\#^/$D\$#d" .git/info/exclude; git reset -q -- "$D" ;;
  *) echo "usage: $0 carry|restore" >&2; exit 2 ;;
esac
git status --short -- "$D"
