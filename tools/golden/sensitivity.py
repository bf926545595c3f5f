#!/usr/bin/env python3
"""How much of a golden survives last-ulp implementation differences.

Reruns a golden's generation with one primitive swapped for an equally valid fp32 implementation
and reports, per variant, the first step whose greedy id differs and the largest step-0 logit
change. The variants are the freedoms a real engine has that the golden pins (docs/GOLDEN.md 2.2):

* fp32_sum: fp32 projections (mHC mixes, router, ratio-2 compressor, head) accumulated in float32
  (BLAS order) instead of exactly and rounded once;
* fast_exp: exp in float32 (numpy's SIMD expf, within 1 ulp) in attention and Sinkhorn;
* fast_sigmoid: 1 / (1 + expf(-x)) in float32 (mHC pre/post, Engram gate).

`stable_prefix` = how many leading greedy ids every variant reproduces: an engine that does not
follow the golden's numerics to the bit can still be expected to match that many.

    sensitivity.py --golden tests/model/data/golden/tiny-s1-even64-reference.json --checkpoint DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numerics as nx  # noqa: E402
import reference_forward as rf  # noqa: E402

F32 = np.float32


def _fp32_linear(x, weight):
    return (np.asarray(x, F32) @ np.asarray(weight, F32).T).astype(F32)


def _fast_exp(x):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.exp(np.asarray(x, F32)).astype(F32)


def _fast_sigmoid(x):
    x = np.asarray(x, F32)
    with np.errstate(over="ignore"):
        return (F32(1) / (F32(1) + np.exp(-x))).astype(F32)


VARIANTS = {"fp32_sum": {"linear_f32": _fp32_linear}, "fast_exp": {"exp32": _fast_exp},
            "fast_sigmoid": {"sigmoid": _fast_sigmoid}}


@contextlib.contextmanager
def swapped(replacements: dict):
    saved = {name: getattr(nx, name) for name in replacements}
    try:
        for name, fn in replacements.items():
            setattr(nx, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nx, name, fn)


def analyse(golden: dict, checkpoint: str) -> dict:
    model = rf.ReferenceModel(checkpoint, golden["index_keys"])
    want = golden["greedy_ids"]
    step0 = golden["steps"][0]["logits"]
    out = {}
    for name, repl in VARIANTS.items():
        with swapped(repl):
            result = model.generate(golden["prompt_ids"], len(want))
        got = result["greedy_ids"]
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if first is None and len(got) != len(want):
            first = min(len(got), len(want))
        logits0 = result["steps"][0]["logits"][:: step0["stride"]]
        dev = float(np.max(np.abs(logits0.astype(np.float64) - np.asarray(step0["strided"], np.float64))))
        out[name] = {"first_diverging_step": first, "greedy_ids": got, "step0_max_abs_logit_diff": rf.j64(dev)}
    firsts = [v["first_diverging_step"] for v in out.values()]
    stable = min([f for f in firsts if f is not None], default=len(want))
    return {"stable_prefix": stable, "variants": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="golden sensitivity to last-ulp implementation differences")
    ap.add_argument("--golden", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    with open(args.golden, encoding="utf-8") as f:
        golden = json.load(f)
    try:
        report = analyse(golden, args.checkpoint)
    except (rf.CheckpointError, ValueError) as e:
        print(f"sensitivity: {e}", file=sys.stderr)
        return 1
    rf.write_report(json.dumps(report, separators=(",", ":")), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
