#!/usr/bin/env bash
# Speculation on vs off through the cluster, in one run: starts scripts/run_cluster.sh (default
# draft: the distilled draft shipped in drafts/; DRAFT_MODEL=self for the first 8 layers), then runs the built-in chat prompts closed-loop with
# --spec off and --spec auto, alternating, at each concurrency, and prints auto / off.
#
#   loadtest/spec_ab.sh [OUT_DIR]
# Environment: SPECD_BUILD [build], THREADS per model service [all cores], CONCURRENCY
# ["1 16"], REQUESTS per point [32], NEW_TOKENS [128], ROUNDS of off/auto pairs [3],
# TEMPERATURE [0], DRAFT_MODEL [default].
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-/tmp/specd-spec-ab}"
BUILD="${SPECD_BUILD:-$ROOT/build}"
THREADS="${THREADS:-$(nproc)}"
LOADTEST="$BUILD/loadtest/specd-loadtest"
[ -x "$LOADTEST" ] || { echo "spec_ab: $LOADTEST missing (build first)" >&2; exit 1; }
PYTHON="$("$ROOT/scripts/python_env.sh")"
mkdir -p "$OUT"
export SPECD_DRAFT_MODEL="${DRAFT_MODEL:-default}"
# shellcheck source=loadtest/cluster_lib.sh
. "$ROOT/loadtest/cluster_lib.sh"
start_cluster spec_ab

COMMON=(--server "localhost:$PORT" --mode closed --prompts builtin
        --max-new-tokens "${NEW_TOKENS:-128}" --temperature "${TEMPERATURE:-0}")
"$LOADTEST" "${COMMON[@]}" --spec off --concurrency 1 --requests 2 >/dev/null  # warm-up
for c in ${CONCURRENCY:-1 16}; do
  n="${REQUESTS:-32}"
  [ "$n" -lt "$c" ] && n="$c"
  for r in $(seq 1 "${ROUNDS:-3}"); do
    for spec in off auto; do
      echo "spec_ab: concurrency $c, --spec $spec, round $r" >&2
      "$LOADTEST" "${COMMON[@]}" --spec "$spec" --concurrency "$c" --requests "$n" \
        --out "$OUT/c${c}_${spec}_${r}.json"
    done
  done
done
stop_cluster

"$PYTHON" - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "c*_*_*.json"))):
    c, spec, _ = os.path.basename(f)[1:-5].split("_")
    p = json.load(open(f))["points"][0]
    if p["ok"] != p["requests"]:
        print(f"spec_ab: {f}: {p['requests'] - p['ok']} requests failed: {p['errors_by_code']}")
    r = rows.setdefault(int(c), {}).setdefault(spec, [])
    r.append(p)
print("| concurrency | off tok/s | auto tok/s | auto / off | ITL p50 off / auto ms | drafts accepted (auto) | tokens per target step (auto) |")
print("|---|---|---|---|---|---|---|")
for c in sorted(rows):
    off = sum(p["throughput_tokens_per_s"] for p in rows[c]["off"]) / len(rows[c]["off"])
    auto = sum(p["throughput_tokens_per_s"] for p in rows[c]["auto"]) / len(rows[c]["auto"])
    acc = [p.get("acceptance_rate") for p in rows[c]["auto"] if p.get("acceptance_rate") is not None]
    a = f"{100 * sum(acc) / len(acc):.1f} %" if acc else "n/a"
    itl = {s: sorted(p["itl_ms"]["p50"] for p in rows[c][s]) for s in ("off", "auto")}
    med = {s: v[len(v) // 2] for s, v in itl.items()}
    tps = [p.get("tokens_per_target_step", 0) for p in rows[c]["auto"]]
    print(f"| {c} | {off:.1f} | {auto:.1f} | {auto / off:.3f}x | {med['off']:.2f} / {med['auto']:.2f} "
          f"| {a} | {sum(tps) / len(tps):.2f} |")
PY
