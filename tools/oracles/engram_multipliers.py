"""Oracle for cedar's numpy.random port (src/model/engram_hash.h, numpy_random::*) and for the Engram
hash multipliers (engram.py compute_hash_multipliers). Runs the real numpy (pinned in
tools/oracles/requirements-engram.txt, venv .venv-engram) and writes
tests/model/data/engram_numpy_oracle.json, which the C++ tests read; CI needs only that JSON.

    python3 -m venv .venv-engram && .venv-engram/bin/pip install -r tools/oracles/requirements-engram.txt
    .venv-engram/bin/python tools/oracles/engram_multipliers.py > tests/model/data/engram_numpy_oracle.json

Integers above 2^53 are written as decimal strings so that no JSON reader can round them.
"""

import json
import sys

import numpy as np

INT64_MAX = int(np.iinfo(np.int64).max)


def multipliers(layer_ids, max_ngram_size, vocab):
    # compute_hash_multipliers of the reference, restated.
    bound = max(1, (INT64_MAX // vocab) // 2)
    rows = []
    for layer_id in layer_ids:
        gen = np.random.default_rng(10007 * layer_id)
        vals = gen.integers(low=0, high=bound, size=(max_ngram_size,), dtype=np.int64)
        rows.append([str(int(v) * 2 + 1) for v in vals])
    return rows


def main():
    seeds = [0, 1, 2, 10007, 10007 * 14, 4294967295, 4294967296, (1 << 40) + 123, (1 << 64) - 1]
    out = {"numpy_version": np.__version__, "seed_sequence": [], "pcg64": [], "integers": [], "sequences": [],
           "multipliers": []}

    for s in seeds:
        ss = np.random.SeedSequence(s)
        out["seed_sequence"].append({
            "entropy": str(s),
            "u32": [int(v) for v in ss.generate_state(8, np.uint32)],
            "u64": [str(int(v)) for v in ss.generate_state(4, np.uint64)],
        })
        bg = np.random.PCG64(s)
        st = bg.state["state"]
        out["pcg64"].append({
            "seed": str(s),
            "state": [str(st["state"] >> 64), str(st["state"] & ((1 << 64) - 1))],
            "inc": [str(st["inc"] >> 64), str(st["inc"] & ((1 << 64) - 1))],
            "raw": [str(int(v)) for v in bg.random_raw(6)],
        })

    # (seed, low, high, count): every branch of random_bounded_uint64_fill, plus ranges whose
    # rejection probability is close to 1/2 so the rejection loops run.
    cases = [
        (7, 0, 1, 5),                              # rng = 0: no draw
        (7, 0, 2, 9),                              # rng = 1, 32-bit Lemire
        (7, -5, 6, 9),                             # negative low
        (11, 0, (1 << 31) + 1, 20),                # 32-bit, rejection ~1/2
        (11, 0, (1 << 32) - 1, 9),                 # rng = 2^32 - 2: largest 32-bit Lemire range
        (11, 0, 1 << 32, 9),                       # rng = 2^32 - 1: plain next_uint32
        (11, 0, (1 << 32) + 1, 9),                 # rng = 2^32: 64-bit Lemire
        (13, 0, (1 << 63) - 1, 9),
        (13, -(1 << 63), (1 << 63) - 1, 9),        # rng = 2^64 - 2
        (13, -(1 << 62), (1 << 62) + 1, 20),       # 64-bit, rejection ~1/2
        (10007, 0, (INT64_MAX // 99092) // 2, 4),  # the released layer-1 draw
        (17, 1000, 1000 + 99092, 12),
    ]
    for seed, low, high, count in cases:
        gen = np.random.default_rng(seed)
        vals = gen.integers(low, high, size=count, dtype=np.int64)
        out["integers"].append({"seed": str(seed), "low": str(low), "high": str(high),
                                "values": [str(int(v)) for v in vals]})

    # Several calls on one generator: the buffered upper half of a 64-bit draw carries over from a
    # 32-bit call into the next 32-bit call, and is kept (not dropped) across a 64-bit call.
    seq_calls = [(0, 100, 3), (0, 1 << 40, 2), (0, 100, 1), (0, 7, 4), (-3, 1 << 35, 3), (0, 5, 2)]
    for seed in (3, 99):
        gen = np.random.default_rng(seed)
        calls = []
        for low, high, count in seq_calls:
            vals = gen.integers(low, high, size=count, dtype=np.int64)
            calls.append({"low": str(low), "high": str(high), "values": [str(int(v)) for v in vals]})
        out["sequences"].append({"seed": str(seed), "calls": calls})

    layer_sets = [[1, 14], [0, 1, 2, 3], [7, 20, 39], [100000], [500000]]
    vocabs = [1, 2, 3, 1000, 99092, 129280, (1 << 29), (1 << 30), (1 << 31) - 1, (1 << 31), (1 << 32),
              3 * (1 << 32), 1 << 40, 1 << 60, 1 << 61, 1 << 62, INT64_MAX]
    for layer_ids in layer_sets:
        for vocab in vocabs:
            for n in (2, 4, 6):
                out["multipliers"].append({"layer_ids": layer_ids, "max_ngram_size": n, "vocab": str(vocab),
                                           "values": multipliers(layer_ids, n, vocab)})
    json.dump(out, sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
