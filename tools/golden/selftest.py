#!/usr/bin/env python3
"""Self-test of the golden harness's primitives against independent expectations: the spec's
published numbers, hand-worked cases, exhaustive enumeration of the small float formats, and
float64 formulations of the same definitions. Prints 'N passed, N failed'; exit 1 on a failure.

    .venv-golden/bin/python tools/golden/selftest.py
"""

from __future__ import annotations

import math
import os
import sys
import traceback

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numerics as nx  # noqa: E402
from engram_hash import build_compressed_token_map, is_prime, released_layout_check  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TESTS = []
_TOKENIZER_JSON = []


def repo_tokenizer_json() -> str:
    """The repository's DeepSeek-V4-series tokenizer.json (data/tokenizers/deepseek-v4, stored as
    .zst), decompressed once into a temporary file with the `zstd` tool."""
    if not _TOKENIZER_JSON:
        import atexit
        import subprocess
        import tempfile
        fd, path = tempfile.mkstemp(suffix="-tokenizer.json")
        with os.fdopen(fd, "wb") as f:
            subprocess.run(["zstd", "-dc", os.path.join(ROOT, "data", "tokenizers", "deepseek-v4", "tokenizer.json.zst")],
                           stdout=f, check=True)
        atexit.register(os.remove, path)
        _TOKENIZER_JSON.append(path)
    return _TOKENIZER_JSON[0]


def test(fn):
    TESTS.append(fn)
    return fn


@test
def engram_released_layout_matches_spec():
    # spec 4.3: 48 distinct primes, first/last of each layer, row sums, and the 8 multipliers
    r = released_layout_check()
    assert r["sums"] == [384006168, 384016682], r["sums"]
    assert r["primes"][0][:3] == [16000057, 16000079, 16000081]
    assert r["primes"][0][-1] == 16000463 and r["primes"][1][0] == 16000477 and r["primes"][1][-1] == 16000889
    flat = r["primes"][0] + r["primes"][1]
    assert len(set(flat)) == 48 and flat == sorted(flat)
    assert r["multipliers"] == [[76632096046245, 4839876093313, 35959672319349, 73987337458391],
                                [67716810739261, 51510806800915, 30921347202721, 82619226485591]]


@test
def miller_rabin_agrees_with_trial_division():
    def slow(n):
        return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))
    for n in list(range(0, 3000)) + list(range(15999900, 16000100)):
        assert is_prime(n) == slow(n), n


@test
def e2m1_rounding_matches_ml_dtypes_exhaustively():
    # every fp32 value on a fine grid over [-6, 6], including all midpoints, against ml_dtypes' cast
    grid = np.concatenate([np.linspace(-6, 6, 48001, dtype=np.float32), nx.E2M1_MIDS, -nx.E2M1_MIDS,
                           np.nextafter(nx.E2M1_MIDS, np.float32(0)), np.nextafter(nx.E2M1_MIDS, np.float32(9))])
    ours = nx.e2m1_round(grid.astype(np.float32))
    theirs = grid.astype(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(ours, theirs)
    # hand cases of spec 2.2: ties 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    hand = nx.e2m1_round(np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.75], np.float32))
    assert hand.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -1.0]


@test
def e4m3_cast_is_nearest_even_with_saturation():
    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    finite = np.unique(codes[np.isfinite(codes)])  # all E4M3 values, ascending
    rng = np.random.default_rng(7)
    xs = np.concatenate([rng.uniform(-500, 500, 20000), (finite[1:] + finite[:-1]) / 2, [1000.0, -1e6]])
    xs = xs.astype(np.float32)
    got = nx.e4m3(xs)
    for x, g in zip(xs.astype(np.float64), got):
        c = min(max(x, -448.0), 448.0)
        dist = np.abs(finite - c)
        best = finite[dist == dist.min()]
        if len(best) == 2:  # tie: the code with an even mantissa (last bit 0)
            bits = [np.array([b], np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)[0] for b in best]
            best = [b for b, bit in zip(best, bits) if bit % 2 == 0]
        assert g == best[0], (x, g, best)


@test
def pow2_ceil_is_the_next_power_of_two():
    rng = np.random.default_rng(1)
    xs = np.concatenate([np.exp2(rng.uniform(-100, 100, 5000)), np.exp2(np.arange(-100, 100))]).astype(np.float32)
    got = nx.pow2_ceil(xs)
    for x, g in zip(xs.astype(np.float64), got.astype(np.float64)):
        m, e = math.frexp(x)  # x = m * 2^e, m in [0.5, 1)
        expect = 2.0 ** (e - 1) if m == 0.5 else 2.0 ** e
        assert g == expect, (x, g, expect)


@test
def fp8_act_quant_hand_cases():
    x = np.zeros(64, np.float32)
    x[0], x[5], x[31] = 1.0, -0.5, 0.3  # block 0: amax 1 -> scale 2^ceil(log2(1/448)) = 2^-8
    x[32] = 448.0 * 4  # block 1: amax 1792 -> scale 4
    q, s = nx.fp8_act_quant(x)
    assert s.tolist() == [2.0 ** -8, 4.0]
    assert q[0] == 256 and q[5] == -128 and q[32] == 448
    assert q[31] == 80.0  # 0.3 * 256 = 76.8; E4M3 spacing is 8 between 64 and 128 -> 80
    zeros = nx.fp8_act_quant(np.zeros(32, np.float32))[1]
    assert zeros[0] == nx.pow2_ceil(np.float32(1e-4) * nx.FP8_MAX_INV)  # amax floored at 1e-4


@test
def fp4_qdq_hand_cases():
    x = np.zeros(32, np.float32)
    x[:4] = [6.0, 3.1, -0.2, 1.75]  # amax 6 -> scale 2^ceil(log2(1)) = 1
    y = nx.fp4_qdq_e8m0(x)
    assert y[:4].tolist() == [6.0, 3.0, -0.0, 2.0]
    x16 = np.zeros(16, np.float32)
    x16[:3] = [0.9, 0.45, -0.1]  # scale e4m3(0.9 / 6 = 0.15) = 0.15625 -> 5.76 -> 6, 2.88 -> 3, -0.64 -> -0.5
    y16 = nx.fp4_qdq_e4m3(x16)
    s = float(nx.e4m3(np.float32(0.9) / np.float32(6)))
    assert s == 0.15625
    assert y16[:3].tolist() == [6 * s, 3 * s, -0.5 * s]


@test
def block_scaled_gemm_equals_float64_dequantised_product():
    rng = np.random.default_rng(3)
    n, k, m = 40, 96, 5
    w = nx.e4m3(rng.normal(0, 30, (n, k)).astype(np.float32))
    scale = np.exp2(rng.integers(-12, -4, (2, 3))).astype(np.float32)
    x = nx.bf16(rng.normal(0, 1, (m, k)).astype(np.float32))
    got = nx.linear_fp8(x, w, scale)
    q, s = nx.fp8_act_quant(x)
    wd = w.astype(np.float64) * np.repeat(np.repeat(scale, 32, 0)[:n], 32, 1)
    xd = (q.reshape(m, 3, 32) * s[..., None]).reshape(m, k).astype(np.float64)
    expect = xd @ wd.T
    assert np.all(np.abs(got - expect) <= 2 ** -8 * 1.001 * np.abs(expect) + 1e-6)  # one bf16 rounding


@test
def sparse_attn_matches_dense_softmax_with_sink():
    rng = np.random.default_rng(5)
    s_len, heads, dim, n = 3, 2, 64, 150
    q = nx.bf16(rng.normal(0, 1, (s_len, heads, dim)).astype(np.float32))
    kv = nx.bf16(rng.normal(0, 1, (n, dim)).astype(np.float32))
    sink = rng.normal(0, 1, heads).astype(np.float32)
    idx = np.stack([rng.permutation(n)[:130] for _ in range(s_len)])
    idx[1, 7:] = -1  # a row with mostly empty slots
    got = nx.sparse_attn(q, kv, sink, idx, dim ** -0.5)
    for s in range(s_len):
        valid = idx[s][idx[s] >= 0]
        logits = q[s].astype(np.float64) @ kv[valid].astype(np.float64).T * dim ** -0.5  # [H, n_valid]
        mx = np.maximum(logits.max(-1, keepdims=True), sink[:, None])
        p = np.exp(logits - mx)
        den = p.sum(-1, keepdims=True) + np.exp(sink[:, None] - mx)
        expect = (p @ kv[valid].astype(np.float64)) / den
        assert np.allclose(got[s], expect, rtol=0.02, atol=0.01), np.abs(got[s] - expect).max()
    empty = nx.sparse_attn(q[:1], kv, sink, np.full((1, 70), -1), 0.125)
    assert not empty.any()  # all -1: zeros, not NaN


@test
def sinkhorn_follows_its_definition():
    rng = np.random.default_rng(9)
    mixes = rng.normal(0, 2, (5, 24)).astype(np.float32)
    pre, post, comb = nx.hc_split_sinkhorn(mixes, np.array([1, 1, 1], np.float32), np.zeros(24, np.float32), 4, 20,
                                           1e-6)
    # float64 restatement of spec 2.7: softmax + eps, column norm, then 19 x (row norm, column norm)
    c = mixes[:, 8:].astype(np.float64).reshape(5, 4, 4)
    c = np.exp(c - c.max(-1, keepdims=True))
    c = c / c.sum(-1, keepdims=True) + 1e-6
    c = c / (c.sum(-2, keepdims=True) + 1e-6)
    for _ in range(19):
        c = c / (c.sum(-1, keepdims=True) + 1e-6)
        c = c / (c.sum(-2, keepdims=True) + 1e-6)
    assert np.allclose(comb, c, atol=1e-5)
    assert np.allclose(comb.sum(-2), 1, atol=1e-5)  # ends on a column normalisation
    assert np.allclose(pre, 1 / (1 + np.exp(-mixes[:, :4].astype(np.float64))) + 1e-6, atol=1e-6)
    assert np.allclose(post, 2 / (1 + np.exp(-mixes[:, 4:8].astype(np.float64))), atol=1e-6)


@test
def yarn_band_matches_spec_derivation():
    # spec 2.5 (derived): d = 64, base 160000, orig 65536, beta 32/1 -> low 15, high 25
    inv = nx.rope_inv_freq(64, 160000, 65536, 16, 32, 1)
    plain = (1.0 / 160000.0 ** (np.arange(0, 64, 2) / 64.0)).astype(np.float32)
    assert np.allclose(inv[:16], plain[:16], rtol=1e-6)  # pairs 0..15 unscaled
    assert np.allclose(inv[25:], plain[25:] / 16, rtol=1e-6)  # pairs 25..31 divided by the factor
    assert all(plain[i] / 16 < inv[i] < plain[i] for i in range(16, 25))


@test
def rope_rotation_is_orthogonal_and_inverse_undoes_it():
    rng = np.random.default_rng(2)
    x = nx.bf16(rng.normal(0, 1, (4, 3, 64)).astype(np.float32))
    cos, sin = nx.rope_cos_sin(np.arange(100, 104), nx.rope_inv_freq(16, 10000, 0, 1, 32, 1))
    y = nx.apply_rope(x, cos, sin)
    assert np.array_equal(y[..., :48], x[..., :48])  # only the last 16 dims rotate
    norms_x = np.hypot(x[..., 48::2], x[..., 49::2])
    norms_y = np.hypot(y[..., 48::2], y[..., 49::2])
    assert np.allclose(norms_x, norms_y, rtol=2 ** -7)
    back = nx.apply_rope(y, cos, sin, inverse=True)
    assert np.allclose(back, x, atol=0.05)
    # position 0: angle 0, the identity
    c0, s0 = nx.rope_cos_sin(np.array([0]), nx.rope_inv_freq(16, 10000, 0, 1, 32, 1))
    assert np.array_equal(nx.apply_rope(x[:1], c0, s0), x[:1])


@test
def rms_norm_definition():
    x = nx.bf16(np.array([[3.0, 4.0] + [0.0] * 30], np.float32))
    w = np.full(32, 2.0, np.float32)
    # mean(x^2) = 25/32 -> rsqrt = sqrt(32)/5; y = 2 * x * sqrt(32) / 5
    expect = nx.bf16((2 * x.astype(np.float64) * math.sqrt(32) / 5).astype(np.float32))
    assert np.array_equal(nx.rms_norm(x, w, 1e-20), expect)


@test
def topk_breaks_ties_by_lower_index():
    s = np.array([[1.0, 3.0, 3.0, 2.0, 3.0, -np.inf]], np.float32)
    order, kth = nx.topk_lowest_index(s, 2)
    assert order.tolist() == [[1, 2]] and kth.tolist() == [3.0]


@test
def compressed_token_map_merges_case_and_spaces():
    tok = repo_tokenizer_json()
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(tok)
    lookup, count = build_compressed_token_map(tok)
    ids = {w: t.token_to_id(w) for w in ("the", "The", "Ġthe", "ĠThe", "THE")}
    classes = {lookup[i] for i in ids.values() if i is not None}
    assert len(classes) == 1, ids
    assert lookup[0] == 0 and count == lookup.max() + 1 and count < len(lookup)
    # whitespace runs collapse to one space, which the sentinel keeps from being stripped away
    space, newline = t.token_to_id("Ġ"), t.token_to_id("Ċ")
    assert lookup[space] == lookup[newline] and lookup[space] not in classes
    assert sorted(set(lookup.tolist())) == list(range(count))  # classes numbered by first appearance
    # the released config's engram_compressed_vocab_size for this vocabulary (129,280 ids)
    assert len(lookup) == 129280 and count == 99092, (len(lookup), count)


def main() -> int:
    passed = failed = 0
    for fn in TESTS:
        try:
            fn()
            passed += 1
            print(f"ok   {fn.__name__}")
        except Exception:  # report every failure, keep going
            failed += 1
            print(f"FAIL {fn.__name__}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
