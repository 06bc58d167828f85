#!/usr/bin/env python3
"""Offline studies of the shipped draft on a held-out distill-data file (twentieth session).

1. A datastore drafter: the most frequent next token after the longest context (1..8 tokens)
   that the training responses contain, against the target's greedy token; alone and as a
   stand-in for the draft model where it is confident.
2. The draft's calibration: its argmax probability against how often the argmax is the
   target's greedy token.
3. The ideal chain policy's ceiling: teacher-forced greedy chains drafted while the product of
   the draft's confidences stays >= keep (another round while >= extend), priced on a
   verify(k+1)/verify(1) curve and a draft round's cost (both measured by specd-bench --spec).

  .venv/bin/python docs/runs/2026-12-07-offline-draft-studies.py TRAIN.bin EVAL.bin \
      [DRAFT_COST] [VERIFY_CURVE k=1..8]
TRAIN.bin / EVAL.bin: a `specd-distill data` run's files (here /tmp/d12800, the nineteenth
session's 12,800-prompt data, and its held-out eval.bin).
"""
import collections
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "distill"))
import specd_distill as sd  # noqa: E402

MAXN = 8


def datastore(train):
    tables = [None] + [collections.defaultdict(collections.Counter) for _ in range(MAXN)]
    for r in train["records"]:
        toks = r["tokens"].tolist()
        for t in range(r["num_prompt"], len(toks)):
            for n in range(1, min(MAXN, t) + 1):
                tables[n][tuple(toks[t - n:t])][toks[t]] += 1
    return tables


def store_predict(tables, ctx):
    for n in range(min(MAXN, len(ctx)), 0, -1):
        c = tables[n].get(tuple(ctx[-n:]))
        if c:
            tok, cnt = c.most_common(1)[0]
            total = sum(c.values())
            return tok, n, cnt / total if total >= 3 else 0.0  # a share of 3+ continuations
    return -1, 0, 0.0


def draft_predictions(ev):
    import jax
    import jax.numpy as jnp
    target = sd.Gguf(os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    emb = jnp.asarray(target.w("token_embd.weight"))
    cfg = sd.forward_config(target)
    params, ids = sd.load_exported(
        os.path.join(ROOT, "drafts", "SmolLM2-135M-Instruct.Q4_1.draft.gguf"), target)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    fwd = jax.jit(lambda p, t: sd.forward(p, emb, t, cfg))
    out = {}
    for ri, r in enumerate(ev["records"]):
        if r["temperature"] != 0:
            continue
        toks, npr = r["tokens"], r["num_prompt"]
        x = np.zeros((1, 256), np.int32)
        x[0, :min(len(toks), 256)] = toks[:256]
        lg = np.asarray(fwd(params, jnp.asarray(x)))[0]
        q = np.exp(lg - lg.max(-1, keepdims=True))
        q /= q.sum(-1, keepdims=True)
        n = min(len(toks) - npr, 256 - npr + 1)
        out[ri] = [(int(ids[q[npr - 1 + j].argmax()]), float(q[npr - 1 + j].max()))
                   for j in range(n)]
    return out


def ceiling(recs, verify, draft_cost, keep, extend, kmax):
    toks = cost = 0.0
    for gs, pr in recs:
        n, t = min(len(gs), len(pr)), 0
        while t < n:
            k, prod, rounds = 0, 1.0, 0
            while k < kmax and t + k < n and (k == 0 or prod >= extend):
                rounds += 1
                if prod * pr[t + k][1] < keep:
                    break
                prod *= pr[t + k][1]
                k += 1
            a = 0
            while a < k and pr[t + a][0] == gs[t + a]:
                a += 1
            toks += min(a + 1, n - t)
            cost += verify[k] + draft_cost * rounds
            t += a + 1
    return toks / cost


def main():
    train, ev = sd.read_data(sys.argv[1]), sd.read_data(sys.argv[2])
    draft_cost = float(sys.argv[3]) if len(sys.argv) > 3 else 0.10
    verify = [1.0] + [float(v) for v in (sys.argv[4:12] or
                                         "1.21 1.29 1.44 1.68 1.86 2.11 2.46 2.76".split())]
    tables = datastore(train)
    dp = draft_predictions(ev)
    g_all, s_all, sn_all, sc_all, d_all, dc_all, recs = [], [], [], [], [], [], []
    for ri, pr in dp.items():
        r = ev["records"][ri]
        toks, npr = r["tokens"].tolist(), r["num_prompt"]
        gs = [int(r["top_ids"][j][0]) for j in range(len(toks) - npr)]
        recs.append((gs, pr))
        for j, (d, dc) in enumerate(pr):
            s, sn, sc = store_predict(tables, toks[:npr + j])
            g_all.append(gs[j]); s_all.append(s); sn_all.append(sn); sc_all.append(sc)
            d_all.append(d); dc_all.append(dc)
    g, s, sn, sc = map(np.array, (g_all, s_all, sn_all, sc_all))
    d, dc = np.array(d_all), np.array(dc_all)
    print(f"{len(g)} held-out greedy positions: draft {np.mean(d == g):.3f}, "
          f"datastore {np.mean(s == g):.3f}, either {np.mean((d == g) | (s == g)):.3f}")
    for thr, mn in ((0.7, 3), (0.9, 6)):
        m = (sc >= thr) & (sn >= mn)
        comb = np.where(m, s, d)
        print(f"datastore where its share >= {thr} after >= {mn} tokens: {m.mean():.3f} of "
              f"positions, right {np.mean(s[m] == g[m]):.3f} there (draft "
              f"{np.mean(d[m] == g[m]):.3f}); combined {np.mean(comb == g):.3f}")
    for c in (0.2, 0.4, 0.6, 0.8):
        m = dc >= c
        print(f"draft confidence >= {c}: {m.mean():.3f} of positions, "
              f"right {np.mean(d[m] == g[m]):.3f}")
    for kmax in (1, 2, 4, 8):
        best = max((ceiling(recs, verify, draft_cost, kp, ex, kmax), kp, ex)
                   for kp in (0.05, 0.1, 0.15, 0.2, 0.3) for ex in (0.3, 0.5, 0.7))
        at_defaults = ceiling(recs, verify, draft_cost, 0.1, 0.5, kmax)
        print(f"k <= {kmax}: ideal chain {best[0]:.3f}x (keep {best[1]}, extend {best[2]}); "
              f"at the defaults 0.1 / 0.5: {at_defaults:.3f}x")


if __name__ == "__main__":
    main()
