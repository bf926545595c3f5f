#!/usr/bin/env python3
"""Hugging Face's Rust tokenizer on the same texts as bench/tokenizer_bench.cc, on one core.

Encodes every corpus text (tests/tokenizer/data/corpus/*.txt.zst) with the shared DeepSeek-V3
tokenizer, repeatedly, and prints the best encode MB/s (per CPU second and per wall second) of --rounds rounds (the first round warms
Hugging Face's word cache, as the C++ benchmark's repetitions warm cedar's).

    RAYON_NUM_THREADS=1 taskset -c 0 .venv-tok/bin/python tools/tokenizer/bench_hf.py
"""

import argparse
import glob
import os
import time

import tokenizers
import zstandard
from tokenizers import Tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    tok = Tokenizer.from_file(os.path.join(ROOT, "..", "shared", "tokenizers", "deepseek-v3", "tokenizer.json"))
    texts = []
    for p in sorted(glob.glob(os.path.join(ROOT, "tests", "tokenizer", "data", "corpus", "*.txt.zst"))):
        texts.append(zstandard.ZstdDecompressor().decompress(open(p, "rb").read()).decode("utf-8"))
    total = sum(len(t.encode("utf-8")) for t in texts)
    best_wall = best_cpu = 0.0
    for _ in range(args.rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        n_ids = 0
        for t in texts:
            n_ids += len(tok.encode(t, add_special_tokens=False).ids)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        best_wall = max(best_wall, total / wall / 1e6)
        best_cpu = max(best_cpu, total / cpu / 1e6)
    # Hugging Face's fastest single-thread path: no offsets (encode_batch_fast, RAYON_NUM_THREADS=1).
    best_fast = 0.0
    for _ in range(args.rounds):
        c0 = time.process_time()
        tok.encode_batch_fast(texts, add_special_tokens=False)
        best_fast = max(best_fast, total / (time.process_time() - c0) / 1e6)
    # CPU time is what Google Benchmark's bytes_per_second uses; it is robust on a shared machine.
    print(f"tokenizers {tokenizers.__version__}: encode_batch_fast (no offsets) {best_fast:.2f} MB/s of CPU time")
    print(
        f"tokenizers {tokenizers.__version__}: {total} bytes, {n_ids} ids, best encode "
        f"{best_cpu:.2f} MB/s of CPU time ({best_wall:.2f} MB/s wall)"
    )


if __name__ == "__main__":
    main()
