#!/usr/bin/env python3
"""Acceptance of draft GGUFs on a `specd distill-data` file: greedy rows as argmax agreement with
the target, sampled rows as sum min(p, q) over the stored top-N (specd_distill.evaluate, the
figures `specd-distill train` reports). Compares drafts on the same data, e.g. a draft on the
held-out set against its own training prompts (docs/PERFORMANCE.md, "The distilled draft,
retrained on varied prompts").

  eval_acceptance.py --target T.gguf --data W/eval.bin [--rows N] DRAFT.gguf [DRAFT.gguf ...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import specd_distill as sd  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="the target GGUF the drafts were made for")
    ap.add_argument("--data", required=True, help="a specd distill-data file (train.bin, eval.bin)")
    ap.add_argument("--rows", type=int, default=0, help="only the first N records (0: all)")
    ap.add_argument("drafts", nargs="+", help="draft GGUFs")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp
    target = sd.Gguf(args.target)
    if not os.path.isfile(args.data):
        sd.die(f"--data {args.data}: no such file")
    data = sd.read_data(args.data)
    if args.rows > 0:
        data["records"] = data["records"][:args.rows]
    if not data["records"]:
        sd.die(f"--data {args.data}: no records")
    emb = jnp.asarray(target.w("token_embd.weight"))
    cfg = sd.forward_config(target)
    temps = [r["temperature"] for r in data["records"]]
    for path in args.drafts:
        if not os.path.isfile(path):
            sd.die(f"draft {path}: no such file")
        params, ids = sd.load_exported(path, target)
        X, S, P, W = sd.make_batches(data, ids, 256, target.vocab)
        r = sd.evaluate(jax.tree_util.tree_map(jnp.asarray, params), emb, cfg, X, S, P, W,
                        temps, 16)
        print(f"{path}: greedy {r['greedy_acceptance']:.4f} ({r['greedy_positions']} positions), "
              f"sampled {r['sampled_acceptance']:.4f} ({r['sampled_positions']} positions)",
              flush=True)


if __name__ == "__main__":
    main()
