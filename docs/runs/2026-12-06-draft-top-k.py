# Offline: how often the target's greedy next token is in the distilled draft's top-1/2/3/4,
# on the target's own greedy responses to the held-out prompts (first draft position).
#   build/tools/specd distill-data -m models/SmolLM2-135M-Instruct.Q4_1.gguf --prompts tools/distill/eval_prompts.jsonl -o /tmp/eval0.bin --temperatures 0 -n 128 -t 2
#   .venv/bin/python docs/runs/2026-12-06-draft-top-k.py /tmp/eval0.bin drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/top2
import os, subprocess, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tools/distill"))
import specd_distill as sd
data_path, draft, target, work = sys.argv[1:5]
specd = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../build/tools/specd")
os.makedirs(work, exist_ok=True)
hits = np.zeros(5); n = 0
conf_bins = {}
for i, r in enumerate(sd.read_data(data_path)["records"]):
    toks = [int(t) for t in r["tokens"]]; npr = r["num_prompt"]
    cache = os.path.join(work, f"top{i}.npy")
    if not os.path.exists(cache):
        out = os.path.join(work, "logits.bin")
        subprocess.run([specd, "logits", "-m", draft, "--borrow-from", target, "--tokens",
                        ",".join(map(str, toks)), "-o", out], check=True, capture_output=True)
        lg = np.fromfile(out, np.float32).reshape(len(toks), -1)
        top = np.argsort(-lg, axis=1)[:, :4].astype(np.int32)
        m = lg.max(1, keepdims=True); p = np.exp(lg - m); p /= p.sum(1, keepdims=True)
        pt = np.take_along_axis(p, top, 1)
        np.save(cache, np.concatenate([top.astype(np.float64), pt], 1))
    arr = np.load(cache); top = arr[:, :4].astype(np.int64); pt = arr[:, 4:]
    for t in range(npr, len(toks)):
        truth = toks[t]; row = top[t - 1]
        n += 1
        for k in range(4):
            if truth in row[:k + 1]: hits[k] += 1
        b = min(int(pt[t - 1, 0] * 10), 9)
        c = conf_bins.setdefault(b, np.zeros(4)); c[0] += 1; c[1] += truth == row[0]; c[2] += truth == row[1]; c[3] += truth in row[:2]
print(f"{n} positions; target greedy in draft top-1 {hits[0]/n:.3f}, top-2 {hits[1]/n:.3f}, top-3 {hits[2]/n:.3f}, top-4 {hits[3]/n:.3f}")
print("by the draft's top-1 probability: share, top-1 right, second right, either")
for b in sorted(conf_bins):
    c = conf_bins[b]; print(f"  p1 in [{b/10:.1f},{(b+1)/10:.1f}): {c[0]/n:.2f}  {c[1]/c[0]:.2f}  {c[2]/c[0]:.2f}  {c[3]/c[0]:.2f}")
