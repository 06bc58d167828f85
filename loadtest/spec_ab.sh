#!/usr/bin/env bash
# Speculation on vs off through the cluster, in one run: starts scripts/run_cluster.sh (default
# draft: the distilled draft shipped in drafts/; DRAFT_MODEL=self for the first 8 layers), then
# runs the built-in chat prompts closed-loop with --spec off and --spec auto, alternating (the
# order swapped each round), at each concurrency, and prints auto / off: the median of the
# rounds' paired ratios, which cancels the machine's drift. From the router's /metrics around
# each run it also prints how many of the drafts were verified in steps of 9 or more sequences,
# and how far the cost model adaptive k decides on was from the auto runs' measured seconds.
#
#   loadtest/spec_ab.sh [OUT_DIR]
# Environment: SPECD_BUILD [build], THREADS per model service [all cores], CONCURRENCY
# ["1 16"], REQUESTS per run [32], NEW_TOKENS [128], ROUNDS of off/auto pairs [3],
# TEMPERATURE [0], SEEDED [1; 0: sampled requests send no seed, so their k is not pinned],
# IGNORE_EOS [1: every request runs NEW_TOKENS tokens, past the end of turn; 0: it stops there],
# DRAFT_MODEL [default], PROMPTS [builtin; edit: editing traffic, see specd-loadtest --prompts],
# SPEC_ON [auto; e.g. draft: the draft model alone] and SPEC_K [empty = the router's adaptive
# k; N: fixed] for the "on" side (its files and columns keep the name auto), and the draft
# service's own settings through its environment (e.g. SPECD_DRAFT_MIN_KEEP=0).
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

COMMON=(--server "localhost:$PORT" --mode closed --prompts "${PROMPTS:-builtin}"
        --max-new-tokens "${NEW_TOKENS:-128}" --temperature "${TEMPERATURE:-0}"
        --seeded "${SEEDED:-1}" --ignore-eos "${IGNORE_EOS:-1}")
"$LOADTEST" "${COMMON[@]}" --spec off --concurrency 1 --requests 2 >/dev/null  # warm-up
for c in ${CONCURRENCY:-1 16}; do
  n="${REQUESTS:-32}"
  [ "$n" -lt "$c" ] && n="$c"
  for r in $(seq 1 "${ROUNDS:-3}"); do
    # Each round swaps which side goes first: the run after another is measurably faster or
    # slower on some machines, so a fixed order would read as a speed difference.
    order="off auto"
    [ $((r % 2)) -eq 0 ] && order="auto off"
    for spec in $order; do
      echo "spec_ab: concurrency $c, --spec $spec, round $r" >&2
      on=(--spec off)
      if [ "$spec" = auto ]; then
        on=(--spec "${SPEC_ON:-auto}")
        [ -n "${SPEC_K:-}" ] && on+=(--k "$SPEC_K")
      fi
      # The router's /metrics around each run: its drafts by step size, its cost ratios.
      scrape_router_metrics "$OUT/c${c}_${spec}_${r}.metrics.before"
      "$LOADTEST" "${COMMON[@]}" "${on[@]}" --concurrency "$c" --requests "$n" \
        --out "$OUT/c${c}_${spec}_${r}.json"
      scrape_router_metrics "$OUT/c${c}_${spec}_${r}.metrics.after"
    done
  done
done
stop_cluster

PYTHONPATH="$ROOT/loadtest" "$PYTHON" - "$OUT" <<'PY'
import glob, json, os, statistics, sys
import metrics_delta
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "c*_*_*.json"))):
    c, spec, r = os.path.basename(f)[1:-5].split("_")
    p = json.load(open(f))["points"][0]
    if p["ok"] != p["requests"]:
        print(f"spec_ab: {f}: {p['requests'] - p['ok']} requests failed: {p['errors_by_code']}")
    rows.setdefault(int(c), {}).setdefault(spec, {})[int(r)] = p
# The machine drifts over a run (shared hosts), so each round's auto is divided by the off run
# beside it, and the median of those paired ratios is the figure; their range is beside it.
def grown(prefix):
    # What the router's series grew by over one run ({} without its scrapes).
    try:
        return metrics_delta.delta(prefix + ".metrics.before", prefix + ".metrics.after")
    except OSError:
        return {}

def batch_drafts(prefix):
    # The router's draft counters by step size (specd_router_batch_draft_*): {(kind, batch): n}.
    got = {}
    for series, n in grown(prefix).items():
        for kind in ("proposed", "accepted"):
            head = f'specd_router_batch_draft_{kind}_tokens_total{{batch="'
            if series.startswith(head):
                got[(kind, series[len(head):series.index('"', len(head))])] = n
    return got

def cost_ratios(c, rounds):
    # The cost model's error in the auto runs: mean measured / predicted seconds of the target
    # steps and of the priced draft rounds (specd_router_step_cost_ratio{stage}).
    sums = {}
    for r in rounds:
        g = grown(os.path.join(out, f"c{c}_auto_{r}"))
        for stage in ("target", "draft"):
            h = metrics_delta.histogram(g, "specd_router_step_cost_ratio", f'stage="{stage}"')
            for part in ("sum", "count"):
                sums[(stage, part)] = sums.get((stage, part), 0.0) + h.get(part, 0.0)
    mean = lambda st: (f"{sums[(st, 'sum')] / sums[(st, 'count')]:.2f}"
                       if sums.get((st, "count"), 0) > 0 else "-")
    return f"{mean('target')} / {mean('draft')}"

def large_step_drafts(c, rounds):
    # Drafts verified in steps of 9 or more sequences: where drafting costs the most.
    total = {"proposed": 0.0, "accepted": 0.0}
    for r in rounds:
        for (kind, batch), n in batch_drafts(os.path.join(out, f"c{c}_auto_{r}")).items():
            if batch in ("9-16", "17-32", "33+"):
                total[kind] += n
    return f"{total['proposed']:.0f} / {total['accepted']:.0f}"

print("| concurrency | off tok/s | auto tok/s | auto / off (median of paired rounds) | paired range | ITL p50 off / auto ms | drafts proposed / accepted (auto) | of which in steps of >= 9 sequences | tokens per target step (auto) | seconds measured / predicted, target / draft (auto) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for c in sorted(rows):
    off, auto = rows[c]["off"], rows[c]["auto"]
    rounds = sorted(set(off) & set(auto))
    tput = {s: [v[r]["throughput_tokens_per_s"] for r in rounds] for s, v in (("off", off), ("auto", auto))}
    ratios = [a / o for a, o in zip(tput["auto"], tput["off"])]
    itl = {s: statistics.median(v[r]["itl_ms"]["p50"] for r in rounds) for s, v in (("off", off), ("auto", auto))}
    drafted = sum(auto[r].get("draft_tokens", 0) for r in rounds)
    accepted = sum(auto[r].get("accepted_tokens", 0) for r in rounds)
    tps = statistics.mean(auto[r].get("tokens_per_target_step", 0) for r in rounds)
    print(f"| {c} | {statistics.mean(tput['off']):.1f} | {statistics.mean(tput['auto']):.1f} "
          f"| {statistics.median(ratios):.3f}x | {min(ratios):.3f}-{max(ratios):.3f} "
          f"| {itl['off']:.2f} / {itl['auto']:.2f} | {drafted} / {accepted} "
          f"| {large_step_drafts(c, rounds)} | {tps:.2f} | {cost_ratios(c, rounds)} |")
PY
