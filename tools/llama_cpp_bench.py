#!/usr/bin/env python3
"""llama.cpp figures for specd-bench: decode tok/s at batch 1, 4 and 16 and prefill tok/s for
128- and 512-token prompts, on the same GGUF and thread count, with the same token ids and
lengths as specd-bench's Runner. Needs llama-cpp-python (PyPI;
scripts/install_llama_cpp_python.sh). Prints three lines:
  llama-cpp-python version=V
  llama.cpp decode=X prefill128=Y prefill512=Z
  llama.cpp batch4=X4 batch16=X16
or, with --prefill-lengths N,N,... (specd-bench --prefill), the version and one line a length:
  llama.cpp prefill_len=N tok_s=X"""
import sys
import time

import numpy as np

import llama_cpp
from llama_cpp import Llama


def batched_decode(llm, threads, n_vocab, steps, plen=32, max_seqs=16):
    """Decode tok/s for 4 and 16 sequences stepped together (one llama_decode call per step
    holding one token of each), as specd-bench's Runner.Decode: each sequence gets the same
    32-token prompt, then greedy steps (`steps` at batch 4, half as many at batch 16, as
    specd-bench does); best of 3. The high-level Llama class holds
    one sequence, so this uses a second context of the same model through the C API with 16
    sequences, each in its own KV stream of 256 cells (kv_unified off: llama.cpp's layout for
    independent sequences, faster here than one unified cache)."""
    p = llama_cpp.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch = 256 * max_seqs, 512, 512  # 256 cells per sequence
    p.n_seq_max, p.kv_unified = max_seqs, False
    p.n_threads = p.n_threads_batch = threads
    p.flash_attn_type = llm.context_params.flash_attn_type
    ctx = llama_cpp.llama_init_from_model(llm.model, p)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed for the batched context")
    batch = llama_cpp.llama_batch_init(512, 0, max_seqs)

    def decode(items):  # items: (token, position, sequence, wants logits)
        batch.n_tokens = len(items)
        for i, (tok, pos, seq, logits) in enumerate(items):
            batch.token[i], batch.pos[i], batch.logits[i] = tok, pos, logits
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
        rc = llama_cpp.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def logits(i):  # row i of the last batch; waits for the computation
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,))

    def run(n_seqs, n_steps):
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        for s in range(n_seqs):
            decode([(100 + i, i, s, i == plen - 1) for i in range(plen)])
            logits(-1)
        nxt = [300] * n_seqs
        t0 = time.perf_counter()
        for step in range(n_steps):
            decode([(nxt[s], plen + step, s, True) for s in range(n_seqs)])
            nxt = [int(np.argmax(logits(s))) for s in range(n_seqs)]
        return n_seqs * n_steps / (time.perf_counter() - t0)

    try:
        run(1, 8)  # warm-up of the new context
        return (max(run(4, steps) for _ in range(3)),
                max(run(max_seqs, steps // 2) for _ in range(3)))
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)


def main():
    path, threads = sys.argv[1], int(sys.argv[2])
    # --prefill-lengths 512,4096: only prefill tok/s at those prompt lengths (best of 2).
    lengths = []
    if len(sys.argv) > 4 and sys.argv[3] == "--prefill-lengths":
        lengths = [int(n) for n in sys.argv[4].split(",")]
    # n_batch = n_ubatch = 512 like our max_batch_tokens, so a 512-token prompt is one pass.
    # flash_attn: llama.cpp's own default ("auto") turns it on for CPU, and it is faster here;
    # llama-cpp-python would otherwise force it off.
    n_ctx = max([1024] + [n + 16 for n in lengths])
    llm = Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                n_batch=512, n_ubatch=512, flash_attn=True, logits_all=False, verbose=False)
    n_vocab = llm.n_vocab()

    def last_logits():
        # llama_get_logits_ith waits for the computation, so timings include all of it.
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,))

    def prefill(n, reps):
        best = 0.0
        toks = [100 + (i * 7) % 5000 for i in range(n)]
        for _ in range(reps):
            llm.reset()  # the next eval drops the cached positions
            t0 = time.perf_counter()
            llm.eval(toks)
            last_logits()
            best = max(best, n / (time.perf_counter() - t0))
        return best

    # Warm-up (pages in the weights), as specd-bench does before measuring.
    llm.reset()
    llm.eval([100 + i for i in range(8)])
    last_logits()

    if lengths:
        print(f"llama-cpp-python version={llama_cpp.__version__}")
        for n in lengths:
            print(f"llama.cpp prefill_len={n} tok_s={prefill(n, 2):.2f}", flush=True)
        return

    # Decode first, in the same order as specd-bench: 32-token prompt, then 64 greedy steps,
    # best of 3.
    steps = 64
    dec = 0.0
    for _ in range(3):
        llm.reset()
        llm.eval([100 + i for i in range(32)])
        nxt = 300
        t0 = time.perf_counter()
        for _ in range(steps):
            llm.eval([nxt])
            nxt = int(np.argmax(last_logits()))
        dec = max(dec, steps / (time.perf_counter() - t0))

    batch4, batch16 = batched_decode(llm, threads, n_vocab, steps)
    p128 = prefill(128, 3)
    p512 = prefill(512, 2)
    print(f"llama-cpp-python version={llama_cpp.__version__}")
    print(f"llama.cpp decode={dec:.2f} prefill128={p128:.2f} prefill512={p512:.2f}")
    print(f"llama.cpp batch4={batch4:.2f} batch16={batch16:.2f}")


if __name__ == "__main__":
    main()
