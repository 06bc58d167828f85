#!/usr/bin/env python3
"""llama.cpp figures for specd-bench: decode tok/s at batch 1 and prefill tok/s for 128- and
512-token prompts, on the same GGUF and thread count. Needs llama-cpp-python (PyPI).
Prints one line: llama.cpp decode=X prefill128=Y prefill512=Z"""
import sys
import time

from llama_cpp import Llama


def main():
    path, threads = sys.argv[1], int(sys.argv[2])
    llm = Llama(model_path=path, n_ctx=1024, n_threads=threads, n_threads_batch=threads,
                n_batch=512, logits_all=False, verbose=False)

    def prefill(n, reps):
        best = 0.0
        toks = [100 + (i * 7) % 5000 for i in range(n)]
        for _ in range(reps):
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(toks)
            best = max(best, n / (time.perf_counter() - t0))
        return best

    p128 = prefill(128, 3)
    p512 = prefill(512, 2)
    llm.reset()
    llm.eval([100 + i for i in range(32)])
    steps = 64
    t0 = time.perf_counter()
    for i in range(steps):
        llm.eval([300 + i % 7])  # decode speed does not depend on which token is fed
    dec = steps / (time.perf_counter() - t0)
    print(f"llama.cpp decode={dec:.2f} prefill128={p128:.2f} prefill512={p512:.2f}")


if __name__ == "__main__":
    main()
