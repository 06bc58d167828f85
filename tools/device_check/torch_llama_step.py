#!/usr/bin/env python3
"""The PyTorch baseline of issue 20, run on the device machine (PyTorch is installed there):
one Llama decode step of a given shape, random bf16 weights, a KV cache already holding
`context` tokens per sequence, timed at several batch sizes, eagerly and replayed from a CUDA
graph. specd's step at the same shape and batch (`specd-bench --device cuda`) is then a ratio
to it, from the same run.

The step is the model's arithmetic written plainly in torch (RMSNorm, RoPE, grouped-query
attention over the cache with scaled_dot_product_attention, SwiGLU, the output head); it is a
baseline for time, not a reference for numerics (the goldens are that).

Usage: torch_llama_step.py [--shape smollm2-135m|llama-3.2-1b|llama-3-8b] [--context N]
                           [--batches 1,8,32] [--reps N]
Prints one line per (batch, mode): milliseconds per step and tokens per second.
"""
import argparse
import sys
import time

SHAPES = {
    # layers, dim, ffn, heads, kv heads, vocab
    "smollm2-135m": (30, 576, 1536, 9, 3, 49152),
    "llama-3.2-1b": (16, 2048, 8192, 32, 8, 128256),
    "llama-3-8b": (32, 4096, 14336, 32, 8, 128256),
}


def build(torch, shape, batch, context, device):
    layers, dim, ffn, heads, kv_heads, vocab = shape
    hd = dim // heads
    bf = torch.bfloat16
    g = torch.Generator(device=device).manual_seed(0)

    def w(*s):
        return (torch.randn(*s, generator=g, device=device, dtype=torch.float32) * 0.02).to(bf)

    params = {
        "emb": w(vocab, dim),
        "head": w(vocab, dim),
        "norm": torch.ones(dim, device=device, dtype=bf),
        "layers": [
            dict(
                qkv=w((heads + 2 * kv_heads) * hd, dim),
                o=w(dim, heads * hd),
                gu=w(2 * ffn, dim),
                down=w(dim, ffn),
                n1=torch.ones(dim, device=device, dtype=bf),
                n2=torch.ones(dim, device=device, dtype=bf),
                k=w(batch, kv_heads, context + 1, hd),
                v=w(batch, kv_heads, context + 1, hd),
            )
            for _ in range(layers)
        ],
    }
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    ang = context * inv
    cos, sin = ang.cos().to(bf), ang.sin().to(bf)
    tokens = torch.randint(0, vocab, (batch,), device=device, generator=g)

    def rms(x, wt):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(bf) * wt

    def rope(x):  # x: [B, H, 1, hd], adjacent pairs
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    F = torch.nn.functional
    group = heads // kv_heads

    def attend(q, k, v):  # q: [B, H, 1, hd]; k, v: [B, Hkv, C + 1, hd]
        try:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        except TypeError:  # torch < 2.5: no enable_gqa
            return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))

    def step():
        x = params["emb"][tokens].unsqueeze(1)  # [B, 1, D]
        for L in params["layers"]:
            h = rms(x, L["n1"])
            qkv = h @ L["qkv"].t()
            q, k, v = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
            q = rope(q.view(batch, 1, heads, hd).transpose(1, 2))
            k = rope(k.view(batch, 1, kv_heads, hd).transpose(1, 2))
            v = v.view(batch, 1, kv_heads, hd).transpose(1, 2)
            L["k"][:, :, context : context + 1] = k  # the new token's slot
            L["v"][:, :, context : context + 1] = v
            a = attend(q, L["k"], L["v"])
            x = x + a.transpose(1, 2).reshape(batch, 1, heads * hd) @ L["o"].t()
            gu = rms(x, L["n2"]) @ L["gu"].t()
            gate, up = gu.split([ffn, ffn], dim=-1)
            x = x + (F.silu(gate) * up) @ L["down"].t()
        return rms(x, params["norm"]) @ params["head"].t()

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("NOT RUN: PyTorch is not installed here (the device machine has it)")
        return 0

    if not torch.cuda.is_available():
        print("NOT RUN: no CUDA device for the PyTorch baseline")
        return 0
    dev = "cuda"
    shape = SHAPES[a.shape]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, shape {a.shape} {shape}, context {a.context}")
    for batch in [int(b) for b in a.batches.split(",")]:
        with torch.inference_mode():
            step = build(torch, shape, batch, a.context, dev)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.reps):
                step()
            torch.cuda.synchronize()
            eager = (time.perf_counter() - t0) / a.reps
            print(f"batch {batch:3d} eager: {eager * 1e3:8.3f} ms/step {batch / eager:9.1f} tok/s")
            try:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        step()
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                graph.replay()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(a.reps):
                    graph.replay()
                torch.cuda.synchronize()
                graphed = (time.perf_counter() - t0) / a.reps
                print(f"batch {batch:3d} graph: {graphed * 1e3:8.3f} ms/step {batch / graphed:9.1f} tok/s")
            except Exception as e:  # a baseline without graphs is still a baseline
                print(f"batch {batch:3d} graph: not measured ({type(e).__name__}: {e})")
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
