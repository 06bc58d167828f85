#!/usr/bin/env python3
"""The n-gram lookup's acceptance by the length of its match, against the distilled draft's at the
same positions, on the target's own greedy responses (greedy: a draft is accepted exactly when it
is the response's next token, so this replays speculation offline, free of the host's noise).
Then a model of batch-1 speculation "auto" (the lookup first, the draft model elsewhere) on
given step costs, with the lookup allowed after matches of >= 1 or >= 2 tokens. A model, not a
measurement: the measured A/B is in docs/PERFORMANCE.md.

  build/tools/specd distill-data -m models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --prompts tools/distill/eval_prompts.jsonl -o /tmp/eval0.bin --temperatures 0 -n 128 -t 2
  .venv/bin/python docs/runs/2026-12-06-lookup-match-length.py /tmp/eval0.bin \
      drafts/SmolLM2-135M-Instruct.Q4_1.draft.gguf models/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/ml
"""
import collections, os, subprocess, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tools/distill"))
import specd_distill as sd  # noqa: E402

data_path, draft, target, work = sys.argv[1:5]
specd = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../build/tools/specd")
os.makedirs(work, exist_ok=True)
recs = []
for i, r in enumerate(sd.read_data(data_path)["records"]):
    toks = [int(t) for t in r["tokens"]]
    cache = os.path.join(work, f"argmax{i}.npy")
    if not os.path.exists(cache):  # the draft's argmax after every prefix, by our engine
        out = os.path.join(work, "logits.bin")
        subprocess.run([specd, "logits", "-m", draft, "--borrow-from", target, "--tokens",
                        ",".join(map(str, toks)), "-o", out], check=True, capture_output=True)
        np.save(cache, np.fromfile(out, np.float32).reshape(len(toks), -1).argmax(1).astype(np.int32))
    recs.append((toks, r["num_prompt"], np.load(cache)))


def lookup(t, k, max_ngram, min_ngram=1):  # NgramDrafter::Lookup: (match length, continuation)
    n = len(t)
    for L in range(min(max_ngram, n - 1), min_ngram - 1, -1):
        for j in range(n - L - 1, -1, -1):
            if t[j:j + L] == t[n - L:]:
                return L, t[j + L:j + L + k]
    return 0, []


def accepted(guess, truth):
    a = 0
    while a < len(guess) and a < len(truth) and guess[a] == truth[a]:
        a += 1
    return a


print("Per response position: the lookup's (max_ngram 12) first-draft acceptance by match length,")
print("its conditional acceptance at draft positions 1..8, and the draft model's at the same positions")
st = collections.defaultdict(lambda: np.zeros(12))
for toks, npr, am in recs:
    for t in range(1, len(toks) - npr):
        L, cont = lookup(toks[:npr + t], 8, 12)
        truth = toks[npr + t:npr + t + 8]
        a = accepted(cont, truth)
        m = accepted([int(am[npr + t - 1 + j]) for j in range(len(truth))], truth)
        s = st[L]
        s[0] += 1; s[1] += len(cont); s[10] += m > 0; s[11] += m
        for j in range(a):
            s[2 + j] += 1
total = sum(s[0] for s in st.values())
for L in sorted(st):
    s = st[L]; c = s[0]
    cond = [s[2] / c] + [s[2 + j] / s[1 + j] if s[1 + j] else 0.0 for j in range(1, 8)]
    print(f"match {L:2d}: {int(c):5d} positions ({c / total:.2f}) | lookup " +
          " ".join(f"{x:.2f}" for x in cond) + f" | draft model first {s[10] / c:.2f}")

# Batch-1 model: per-sequence acceptance estimates as KPolicy's (decay 0.9, prior weight 4),
# k maximising expected tokens per second on the given costs.
COSTS = {  # name: (verify(1..9) in target steps, one draft round in target steps)
    "calibrated (specd-bench --depth 32 --verify)": ([1, 1.03, 1.11, 1.22, 1.30, 1.44, 1.59, 1.83, 2.04], 0.5 / 3.4),
    "in the loop (timed per step size in specd-bench --spec)": ([1, 1.108, 1.25, 1.34, 1.40, 1.50, 1.86, 1.99, 2.1], 0.6 / 4.011),
}


class Est:
    def __init__(self, prior): self.a, self.t, self.prior = 0.0, 0.0, prior
    def alpha(self): return (self.a + 4 * self.prior) / (self.t + 4)
    def update(self, k, a):
        if k > 0:
            self.a = 0.9 * self.a + a
            self.t = 0.9 * self.t + a + (1 if a < k else 0)


def best_k(alpha, kmax, verify, draft):
    rates = [sum(alpha ** j for j in range(k + 1)) / (verify[k] + draft * k) for k in range(kmax + 1)]
    return int(np.argmax(rates))


def model(verify, draft, min_match, n_prompts, n_tokens, max_ngram=4):
    tokens = cost = 0.0
    for toks, npr, am in recs[:n_prompts]:
        t, end = 1, min(len(toks) - npr, n_tokens)
        own, look = Est(0.5), Est(0.66)
        while t < end:
            L, cont = lookup(toks[:npr + t], 8, max_ngram)
            truth = toks[npr + t:npr + t + 9]
            k = best_k(look.alpha(), min(8, len(cont)), verify, 0.0) if L >= min_match else 0
            if k > 0:
                a = accepted(cont[:k], truth); look.update(k, a); cost += verify[k]
            else:
                if L >= min_match:
                    look.update(0, 0)
                k = best_k(own.alpha(), 4, verify, draft)
                a = accepted([int(am[npr + t - 1 + j]) for j in range(min(k, len(truth)))], truth)
                own.update(k, a); cost += verify[k] + draft * k
            step = min(a + 1, end - t); tokens += step; t += step
    return tokens / cost


print("\nModelled batch-1 speed-up of speculation auto over plain decoding")
for name, (verify, draft) in COSTS.items():
    for n_prompts, n_tokens in ((16, 64), (64, 1000)):
        r = [model(verify, draft, m, n_prompts, n_tokens) for m in (1, 2)]
        print(f"{name}, {n_prompts} prompts x {n_tokens if n_tokens < 1000 else 'whole'} tokens: "
              f"min match 1 {r[0]:.3f}x, min match 2 {r[1]:.3f}x")
