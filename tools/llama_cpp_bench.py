#!/usr/bin/env python3
"""llama.cpp figures for specd-bench: decode tok/s at batch 1 and prefill tok/s for 128- and
512-token prompts, on the same GGUF and thread count, with the same token ids and lengths as
specd-bench's Runner. Needs llama-cpp-python (PyPI; scripts/install_llama_cpp_python.sh).
Prints two lines:
  llama-cpp-python version=V
  llama.cpp decode=X prefill128=Y prefill512=Z"""
import sys
import time

import numpy as np

import llama_cpp
from llama_cpp import Llama


def main():
    path, threads = sys.argv[1], int(sys.argv[2])
    # n_batch = n_ubatch = 512 like our max_batch_tokens, so a 512-token prompt is one pass.
    # flash_attn: llama.cpp's own default ("auto") turns it on for CPU, and it is faster here;
    # llama-cpp-python would otherwise force it off.
    llm = Llama(model_path=path, n_ctx=1024, n_threads=threads, n_threads_batch=threads,
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

    p128 = prefill(128, 3)
    p512 = prefill(512, 2)
    print(f"llama-cpp-python version={llama_cpp.__version__}")
    print(f"llama.cpp decode={dec:.2f} prefill128={p128:.2f} prefill512={p512:.2f}")


if __name__ == "__main__":
    main()
