#!/usr/bin/env python3
"""Independent reference for the specd engine: a float64 numpy Llama forward over the GGUF
weights, dequantized by the `gguf` PyPI package (not our C++ code).

Matmuls use float activations (the engine's `exact_activations` mode) and K/V are rounded to
float16 as the engine's default KV cache stores them; everything else is float64.
--act-quant instead rounds matmul inputs to int8 blocks of 32 (kernels/act_quant.h, the fast
default mode); that mode's rounding flips make logits differ by tenths between any two
implementations (even our own reference and fast kernels), so its goldens are only printed.

Writes tests/data/model/smollm2_goldens.json: for each prompt, the prompt token ids, the
top-20 (id, logit) at every position of prompt + greedy continuation, and the 64-token greedy
continuation.

--long writes tests/data/model/smollm2_long_golden.json instead: one chat prompt of LONG_TOKENS
tokens (docs/DESIGN.md's text as the user's message, cut to length; the ids are stored, so the
file stays valid when the document changes) and the top-2 (id, logit) at every position.

Usage: python scripts/gen_model_goldens.py models/SmolLM2-135M-Instruct.Q4_1.gguf [--long]
Requires: gguf, numpy, tokenizers (scripts/requirements-dev.txt).
"""
import argparse
import json
import sys

import numpy as np
import gguf
from gguf import quants

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n",
    "1, 2, 3, 4, 5,",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Türkiye'nin başkenti",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "In machine learning, speculative decoding is",
    "import numpy as np\nx = np.arange(10)\nprint(",
]
N_NEW = 64
TOP = 20
LONG_TOKENS = 2100


def field(r, key):
    f = r.fields[key]
    return f.contents()


def build_tokenizer(r):
    from tokenizers import Tokenizer, Regex, AddedToken
    from tokenizers.models import BPE
    from tokenizers import pre_tokenizers, decoders

    tokens = field(r, "tokenizer.ggml.tokens")
    merges = field(r, "tokenizer.ggml.merges")
    types = field(r, "tokenizer.ggml.token_type")
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in merges]
    tk = Tokenizer(BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types) if ty in (3, 4)]
    tk.add_special_tokens(specials)
    return tk


class Model:
    def __init__(self, path, act_quant):
        r = gguf.GGUFReader(path)
        self.r = r
        self.act_quant = act_quant
        a = "llama."
        self.D = int(field(r, a + "embedding_length"))
        self.L = int(field(r, a + "block_count"))
        self.H = int(field(r, a + "attention.head_count"))
        self.Hkv = int(field(r, a + "attention.head_count_kv"))
        self.d = self.D // self.H
        self.eps = float(field(r, a + "attention.layer_norm_rms_epsilon"))
        self.base = float(field(r, a + "rope.freq_base"))
        self.t = {t.name: t for t in r.tensors}
        self.emb = self.w("token_embd.weight")
        self.out = self.w("output.weight") if "output.weight" in self.t else self.emb
        self.norm = self.w("output_norm.weight")
        self.layers = []
        for l in range(self.L):
            p = f"blk.{l}."
            self.layers.append({k: self.w(p + k + ".weight") for k in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")})
        self.inv_freq = 1.0 / (self.base ** (np.arange(0, self.d, 2, dtype=np.float64) / self.d))

    def w(self, name):
        t = self.t[name]
        return np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float64)

    def act(self, x):
        """Round matmul inputs to int8 blocks of 32, as the engine's contract says."""
        if not self.act_quant:
            return x
        shp = x.shape
        xb = x.astype(np.float32).reshape(-1, 32)
        amax = np.abs(xb).max(axis=1, keepdims=True)
        dsc = (amax / np.float32(127.0)).astype(np.float32)
        inv = np.where(dsc != 0, np.float32(1.0) / np.where(dsc != 0, dsc, 1), 0).astype(np.float32)
        q = np.clip(np.rint(xb * inv), -127, 127)
        return (q.astype(np.float64) * dsc.astype(np.float64)).reshape(shp)

    def mm(self, W, x):
        return self.act(x) @ W.T

    def rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        # x: [H, d]; GGUF llama weights are permuted for adjacent-pair rotation.
        ang = pos * self.inv_freq
        c, s = np.cos(ang), np.sin(ang)
        x0, x1 = x[:, 0::2], x[:, 1::2]
        y = np.empty_like(x)
        y[:, 0::2] = x0 * c - x1 * s
        y[:, 1::2] = x0 * s + x1 * c
        return y

    def kvround(self, x):
        return x.astype(np.float16).astype(np.float64)

    def step(self, tok, pos, cache):
        """One token at `pos`; cache: per layer list of (k, v). Returns logits [vocab]."""
        x = self.emb[tok].copy()
        if self.t["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F32:
            pass
        group = self.H // self.Hkv
        for l, W in enumerate(self.layers):
            h = self.rms(x, W["attn_norm"])
            q = self.mm(W["attn_q"], h).reshape(self.H, self.d)
            k = self.mm(W["attn_k"], h).reshape(self.Hkv, self.d)
            v = self.mm(W["attn_v"], h).reshape(self.Hkv, self.d)
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            cache[l][0].append(self.kvround(k))
            cache[l][1].append(self.kvround(v))
            K = np.stack(cache[l][0])  # [n, Hkv, d]
            V = np.stack(cache[l][1])
            o = np.empty((self.H, self.d))
            for hh in range(self.H):
                kh = hh // group
                sc = K[:, kh, :] @ q[hh] / np.sqrt(self.d)
                sc = np.exp(sc - sc.max())
                sc /= sc.sum()
                o[hh] = sc @ V[:, kh, :]
            x = x + self.mm(W["attn_output"], o.reshape(-1))
            h = self.rms(x, W["ffn_norm"])
            g = self.mm(W["ffn_gate"], h)
            u = self.mm(W["ffn_up"], h)
            a = g / (1.0 + np.exp(-g)) * u
            x = x + self.mm(W["ffn_down"], a)
        return self.mm(self.out, self.rms(x, self.norm))


def long_golden(m, tk, out):
    """Teacher-forced top-2 at every position of one long chat prompt."""
    head = tk.encode("<|im_start|>user\nSummarize this design document:\n",
                     add_special_tokens=False).ids
    tail = tk.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids
    body = tk.encode(open("docs/DESIGN.md", encoding="utf-8").read(), add_special_tokens=False).ids
    ids = head + body[: LONG_TOKENS - len(head) - len(tail)] + tail
    cache = [([], []) for _ in range(m.L)]
    rows = []
    for pos, tok in enumerate(ids):
        lg = m.step(tok, pos, cache)
        idx = np.argsort(-lg, kind="stable")[:2]
        rows.append([[int(i), round(float(lg[i]), 5)] for i in idx])
        if pos % 200 == 0:
            print(f"long golden: {pos}/{len(ids)}", file=sys.stderr)
    with open(out, "w") as f:
        json.dump({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "top_n": 2,
                   "contract": "float activations (exact_activations); f16 KV",
                   "prompt_ids": ids, "top": rows}, f, separators=(",", ":"))
    print(f"wrote {out}: {len(ids)} positions", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--out", default=None)
    ap.add_argument("--act-quant", action="store_true")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--long", action="store_true")
    args = ap.parse_args()
    m = Model(args.model, args.act_quant)
    tk = build_tokenizer(m.r)
    if args.long:
        long_golden(m, tk, args.out or "tests/data/model/smollm2_long_golden.json")
        return
    args.out = args.out or "tests/data/model/smollm2_goldens.json"
    eos = int(field(m.r, "tokenizer.ggml.eos_token_id"))
    cases = []
    for pi, text in enumerate(PROMPTS[: args.prompts]):
        ids = tk.encode(text, add_special_tokens=False).ids
        cache = [([], []) for _ in range(m.L)]
        tops, gen = [], []
        seq = list(ids)
        pos = 0
        for tok in ids:
            logits = m.step(tok, pos, cache)
            pos += 1
            tops.append(logits)
        while len(gen) < N_NEW:
            nxt = int(np.argmax(tops[-1]))
            gen.append(nxt)
            if len(gen) == N_NEW:
                break
            tops.append(m.step(nxt, pos, cache))
            pos += 1
        rows = []
        for lg in tops:
            idx = np.argsort(-lg, kind="stable")[:TOP]
            rows.append([[int(i), round(float(lg[i]), 5)] for i in idx])
        cases.append({"prompt": text, "prompt_ids": ids, "greedy": gen, "top": rows})
        print(f"prompt {pi}: {len(ids)} tokens -> {tk.decode(gen)!r}", file=sys.stderr)
    if args.act_quant:
        print("int8 activation mode: not writing goldens", file=sys.stderr)
        return
    with open(args.out, "w") as f:
        json.dump({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "top_n": TOP,
                   "contract": "float activations (exact_activations); f16 KV",
                   "cases": cases}, f, separators=(",", ":"))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
