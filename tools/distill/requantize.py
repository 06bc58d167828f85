#!/usr/bin/env python3
"""Re-exports a draft GGUF (from `specd-distill train`) at other tensor types, without training
again: its weights are dequantized and written anew, the rest of the file (head token ids,
tokenizer, recipe) kept. Going down from q8_0 costs the draft little: the shipped draft is the
q8_0 export requantized to q4_1 (layers and head): 0.507 held-out greedy agreement against 0.520,
its file 9.2 MB instead of 14.3, its round in the loop ~0.6 of the q8_0 one (docs/PERFORMANCE.md).

  requantize.py --target T.gguf [--layer-type q4_1] [--head-type q8_0] IN.gguf OUT.gguf
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import specd_distill as sd  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="the target GGUF the draft was made for")
    ap.add_argument("--layer-type", choices=sd.EXPORT_TYPES, default="q4_1")
    ap.add_argument("--head-type", choices=sd.EXPORT_TYPES, default="q8_0")
    ap.add_argument("draft", help="the draft GGUF to re-export")
    ap.add_argument("output", help="the new draft GGUF")
    args = ap.parse_args()
    target = sd.Gguf(args.target)
    if not os.path.isfile(args.draft):
        sd.die(f"draft {args.draft}: no such file")
    if os.path.abspath(args.draft) == os.path.abspath(args.output):
        sd.die(f"output {args.output}: the same file as the draft (the engine may have it mapped)")
    params, head_ids = sd.load_exported(args.draft, target)
    recipe = json.loads(str(sd.Gguf(args.draft).field("specd.draft.recipe", "{}")))
    recipe["requantized"] = {"from": os.path.basename(args.draft),
                             "layer_type": args.layer_type, "head_type": args.head_type}
    sd.export_gguf(target, params, head_ids, args.output, args.layer_type, args.head_type, recipe)
    print(f"requantize: wrote {args.output} (layers {args.layer_type}, head {args.head_type})",
          file=sys.stderr)


if __name__ == "__main__":
    main()
