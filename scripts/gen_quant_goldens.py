#!/usr/bin/env python3
"""Generates golden data for the GGUF reader and reference (de)quantizers.

The expected values come from the PyPI `gguf` package (its numpy (de)quantizers), i.e. an
implementation independent of ours. Outputs (committed, small):

  tests/data/quant_goldens.gguf
      raw.<TYPE>   random blocks of TYPE (random bytes, with sane finite f16 scales)
      deq.<TYPE>   F32: gguf.quants.dequantize(raw.<TYPE>)
      qsrc         F32 inputs for the quantizers
      quant.<TYPE> gguf.quants.quantize(qsrc, TYPE) for TYPE in Q8_0/Q4_0/Q4_1/F16/BF16
  tests/data/smollm2_expected.txt   (only when the real model is present)
      first values of a few tensors of SmolLM2-135M-Instruct.Q4_1.gguf, dequantized by gguf-py,
      as float32 bit patterns.

Usage: python scripts/gen_quant_goldens.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import argparse
import importlib.metadata
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# type -> (number of blocks, byte offsets of f16 scale fields inside a block)
RAW_TYPES = {
    T.Q4_0: (8, [0]),
    T.Q4_1: (8, [0, 2]),
    T.Q5_0: (8, [0]),
    T.Q5_1: (8, [0, 2]),
    T.Q8_0: (8, [0]),
    T.Q2_K: (3, [80, 82]),
    T.Q3_K: (3, [108]),
    T.Q4_K: (3, [0, 2]),
    T.Q5_K: (3, [0, 2]),
    T.Q6_K: (3, [208]),
}


def sane_f16(rng, n):
    """Finite f16 scales of varied magnitude and sign (no NaN/inf)."""
    mag = rng.uniform(1e-3, 2.0, n) * rng.choice([1e-2, 1e-1, 1.0], n)
    sign = rng.choice([-1.0, 1.0], n)
    return (mag * sign).astype(np.float16)


def raw_blocks(rng, qtype, n_blocks, scale_offsets):
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in scale_offsets:
        raw[:, off:off + 2] = sane_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    # One row of n_blocks blocks: shape (1, bytes) so gguf-py infers dims [n_blocks*block_size, 1].
    return raw.reshape(1, -1)


def special_f16_bits():
    return np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF,
                     0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE01, 0x3555], dtype=np.uint16)


def write_goldens(path, rng):
    w = gguf.GGUFWriter(path, arch="goldens")
    w.add_string("specd.goldens.generator",
                 f"gguf-py {importlib.metadata.version('gguf')} numpy {np.__version__}")
    for qtype, (n_blocks, offs) in RAW_TYPES.items():
        raw = raw_blocks(rng, qtype, n_blocks, offs)
        w.add_tensor(f"raw.{qtype.name}", raw, raw_dtype=qtype)
        w.add_tensor(f"deq.{qtype.name}", dequantize(raw, qtype).astype(np.float32))

    # Plain types: random bit patterns plus the special values (inf, NaN, subnormals, -0).
    f16 = np.concatenate([special_f16_bits(),
                          rng.integers(0, 65536, 240, dtype=np.uint16)]).reshape(1, -1)
    w.add_tensor("raw.F16", f16.view(np.uint8), raw_dtype=T.F16)
    w.add_tensor("deq.F16", dequantize(f16.view(np.uint8), T.F16).astype(np.float32))
    bf16 = np.concatenate([special_f16_bits(),
                           rng.integers(0, 65536, 240, dtype=np.uint16)]).reshape(1, -1)
    w.add_tensor("raw.BF16", bf16.view(np.uint8), raw_dtype=T.BF16)
    w.add_tensor("deq.BF16", dequantize(bf16.view(np.uint8), T.BF16).astype(np.float32))
    f32 = rng.standard_normal(64).astype(np.float32).reshape(1, -1)
    w.add_tensor("raw.F32", f32)
    w.add_tensor("deq.F32", dequantize(f32, T.F32).astype(np.float32))

    # Quantizer inputs: 16 blocks of 32, including edge cases (all zero, constant, one spike,
    # exact ties at the block maximum, mixed magnitudes).
    src = (rng.standard_normal((16, 32)) * rng.choice([1e-3, 0.1, 1.0, 30.0], (16, 1)))
    src = src.astype(np.float32)
    src[0] = 0.0
    src[1] = 0.75
    src[2] = 0.0
    src[2, 7] = -3.5
    src[3, :] = np.linspace(-1, 1, 32, dtype=np.float32)
    src[4, 3] = 2.0
    src[4, 9] = -2.0
    src = src.reshape(1, -1)
    w.add_tensor("qsrc", src)
    for qtype in (T.Q8_0, T.Q4_0, T.Q4_1, T.F16, T.BF16):
        q = quantize(src, qtype)
        w.add_tensor(f"quant.{qtype.name}", q.view(np.uint8).reshape(1, -1), raw_dtype=qtype)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_model_expectations(model, out):
    r = gguf.GGUFReader(model)
    picks = [
        ("token_embd.weight", 0, 64),            # Q8_0, first row
        ("token_embd.weight", 576 * 1000, 32),   # Q8_0, row 1000
        ("blk.0.attn_q.weight", 0, 64),          # Q4_1
        ("blk.29.ffn_down.weight", 1536 * 5, 64),  # Q4_1, row 5
        ("blk.0.attn_norm.weight", 0, 16),       # F32
        ("output_norm.weight", 0, 16),           # F32
    ]
    by_name = {t.name: t for t in r.tensors}
    with open(out, "w") as f:
        f.write("# Generated by scripts/gen_quant_goldens.py from SmolLM2-135M-Instruct.Q4_1.gguf\n")
        f.write("# using gguf-py dequantize. Format: tensor NAME TYPE START COUNT, then COUNT\n")
        f.write("# float32 bit patterns (hex), starting at flat element START.\n")
        for name, start, count in picks:
            t = by_name[name]
            vals = dequantize(t.data, t.tensor_type).reshape(-1)[start:start + count]
            f.write(f"tensor {name} {t.tensor_type.name} {start} {count}\n")
            bits = vals.astype(np.float32).view(np.uint32)
            for i in range(0, count, 8):
                f.write(" ".join(f"{b:08x}" for b in bits[i:i + 8]) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models",
                                                     "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--seed", type=int, default=20240601)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    out = os.path.join(ROOT, "tests", "data", "quant_goldens.gguf")
    write_goldens(out, rng)
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")
    if os.path.exists(args.model):
        exp = os.path.join(ROOT, "tests", "data", "smollm2_expected.txt")
        write_model_expectations(args.model, exp)
        print(f"wrote {exp}")
    else:
        print(f"model {args.model} not found; skipped smollm2_expected.txt", file=sys.stderr)


if __name__ == "__main__":
    main()
