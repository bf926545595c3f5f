"""Numeric primitives of the DeepSeek-V4.1 reference forward pass, in numpy.

Every function follows the semantics of the official `inference/model.py` + `kernel.py` (read through
the torch CPU port `kernel_cpu.py`, spec sections 2.1-2.8). Conventions:

* A "bf16 tensor" of the reference is a float32 array whose values are all bf16-representable.
  `bf16()` rounds float32 -> bf16 (round-to-nearest-even) and back; it refuses float64 input so that
  no value is ever rounded twice by accident (float64 -> float32 -> bf16 must be explicit).
* Reductions whose reference kernel accumulates in fp32 (GEMM blocks, norms, softmax sums) are
  computed here in float64 and rounded once to float32: the fp32 result of an exact sum. A real fp32
  accumulator differs from it by a few fp32 ulps, which flips the following bf16 rounding rarely;
  docs/GOLDEN.md says where this matters.
* FP8 / FP4 block-scaled GEMM block partials are exact in float64 (products of E4M3 x E4M3 or
  E2M1 x E4M3 values are multiples of 2^-18 below 2^23), so those partials are the exact block sums
  rounded once to fp32, then accumulated in fp32 in K order like the kernel.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
F64 = np.float64
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E8M0 = ml_dtypes.float8_e8m0fnu

FP8_MAX = F32(448.0)
FP4_MAX = F32(6.0)
# The kernels multiply by the reciprocal held as an fp32 constant (kernel.py fp8_max_inv / fp4_max_inv).
FP8_MAX_INV = F32(1.0 / 448.0)
FP4_MAX_INV = F32(1.0 / 6.0)
# E2M1 magnitudes by 3-bit code; a 4-bit code adds the sign in bit 3.
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F32)
FP4_TABLE = np.concatenate([E2M1_GRID, -E2M1_GRID]).astype(F32)
# Midpoints between consecutive E2M1 codes. Round-to-nearest-even: an exact tie goes to the even
# code, i.e. up at 0.75, 1.75 and 3.5 (the upper code is even there) and down at the others.
E2M1_MIDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=F32)
E2M1_TIE_UP = np.array([False, True, False, True, False, True, False])
FP8_BLOCK = 32  # V4.1: one scale per 32x32 weight tile / per 32 activations
SPARSE_ATTN_BLOCK = 64  # kernel.py sparse_attn walks the index list in blocks of 64


def f32(x) -> np.ndarray:
    """Round to float32 (from float64 results of exact or near-exact reductions)."""
    return np.asarray(x).astype(F32)


def bf16(x: np.ndarray) -> np.ndarray:
    """Round a float32 array to bf16 (RNE) and return it as float32."""
    x = np.asarray(x)
    if x.dtype != F32:
        raise TypeError(f"bf16() takes float32 input, got {x.dtype}: round to float32 explicitly first")
    return x.astype(BF16).astype(F32)


def is_bf16(x: np.ndarray) -> bool:
    return bool(np.array_equal(bf16(np.asarray(x, F32)), np.asarray(x, F32), equal_nan=True))


def e4m3(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest E4M3 value (RNE), saturating at +-448 like the CUDA satfinite cast."""
    return np.clip(np.asarray(x, F32), -FP8_MAX, FP8_MAX).astype(E4M3).astype(F32)


def pow2_ceil(x: np.ndarray) -> np.ndarray:
    """2^ceil(log2(x)) for positive normal fp32 x, by exponent bits (kernel.py fast_round_scale):
    the exponent field, plus one when any mantissa bit is set."""
    bits = np.ascontiguousarray(x, dtype=F32).view(np.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    log2_ceil = exponent - 127 + (mantissa != 0).astype(np.int32)
    return ((log2_ceil + 127) << 23).astype(np.int32).view(F32)


def e2m1_codes(v: np.ndarray) -> np.ndarray:
    """fp32 values already clamped to [-6, 6] -> 4-bit E2M1 codes (bit 3 = sign), RNE."""
    mag = np.abs(v)[..., None]
    code = (mag > E2M1_MIDS).sum(-1) + ((mag == E2M1_MIDS) & E2M1_TIE_UP).sum(-1)
    return code.astype(np.uint8) | (np.signbit(v).astype(np.uint8) << 3)


def e2m1_round(v: np.ndarray) -> np.ndarray:
    return FP4_TABLE[e2m1_codes(v).astype(np.int64)]


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """Packed E2M1 bytes [..., K/2] -> values [..., K]; the even element is in the low nibble."""
    b = np.asarray(packed).view(np.uint8)
    lo = FP4_TABLE[(b & 0x0F).astype(np.int64)]
    hi = FP4_TABLE[(b >> 4).astype(np.int64)]
    return np.stack([lo, hi], axis=-1).reshape(*b.shape[:-1], b.shape[-1] * 2)


# ---------------------------------------------------------------------------------------------
# Activation quantisers (spec 2.1, 2.2)


def fp8_act_quant(x: np.ndarray, block: int = FP8_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Per `block` consecutive values along the last dim: power-of-two scale from the block amax
    (floored at 1e-4), values cast to E4M3. Returns (E4M3 values as fp32, scales as fp32)."""
    x = np.asarray(x, F32)
    if x.shape[-1] % block:
        raise ValueError(f"act_quant: last dim {x.shape[-1]} is not a multiple of the block {block}")
    xg = x.reshape(*x.shape[:-1], -1, block)  # [..., n_blocks, block]
    amax = np.maximum(np.abs(xg).max(-1), F32(1e-4))
    scale = pow2_ceil(amax * FP8_MAX_INV)  # [..., n_blocks]
    q = e4m3(xg / scale[..., None])
    return q.reshape(x.shape), scale


def fp8_qdq(x: np.ndarray, block: int = FP8_BLOCK) -> np.ndarray:
    """act_quant(inplace=True): quantise to E4M3 and write back bf16(q * s) (exact in bf16)."""
    q, scale = fp8_act_quant(x, block)
    qg = q.reshape(*q.shape[:-1], -1, block)
    return bf16((qg * scale[..., None]).reshape(q.shape))


def fp4_qdq_e8m0(x: np.ndarray, block: int = 32) -> np.ndarray:
    """fp4_act_quant with E8M0 scales (indexer q and index keys): power-of-two scale per block,
    amax floored at 6*2^-126, E2M1 RNE, written back as bf16."""
    x = np.asarray(x, F32)
    xg = x.reshape(*x.shape[:-1], -1, block)
    amax = np.maximum(np.abs(xg).max(-1), F32(6.0 * 2.0**-126))
    scale = pow2_ceil(amax * FP4_MAX_INV)
    v = np.clip(xg / scale[..., None], -FP4_MAX, FP4_MAX)
    return bf16((e2m1_round(v) * scale[..., None]).reshape(x.shape))


def fp4_qdq_e4m3(x: np.ndarray, block: int = 16) -> np.ndarray:
    """fp4_act_quant with E4M3 scales (compressed main KV): scale = e4m3(amax / 6), amax floored at
    6*2^-9, so the scale is not a power of two and x / scale is a real fp32 division."""
    x = np.asarray(x, F32)
    xg = x.reshape(*x.shape[:-1], -1, block)
    amax = np.maximum(np.abs(xg).max(-1), F32(6.0 * 2.0**-9))
    scale = e4m3(amax / FP4_MAX)
    v = np.clip(xg / scale[..., None], -FP4_MAX, FP4_MAX)
    return bf16((e2m1_round(v) * scale[..., None]).reshape(x.shape))


# ---------------------------------------------------------------------------------------------
# Linear layers (spec 2.3)


def _block_scaled_gemm(a_vals, a_scale, b_vals, b_scale_rows):
    """sum_kb (A_kb . B_kb^T) * a_s[:, kb] * b_s[:, kb], block partials exact then fp32, added in
    K order. a_vals [M, K], a_scale [M, K/32], b_vals [N, K], b_scale_rows [N, K/32]."""
    m, k = a_vals.shape
    n = b_vals.shape[0]
    nb = k // FP8_BLOCK
    a_blocks = a_vals.astype(F64).reshape(m, nb, FP8_BLOCK).transpose(1, 0, 2)  # [nb, M, 32]
    b_blocks = b_vals.astype(F64).reshape(n, nb, FP8_BLOCK).transpose(1, 2, 0)  # [nb, 32, N]
    partials = np.matmul(a_blocks, b_blocks).astype(F32)  # [nb, M, N]
    acc = np.zeros((m, n), dtype=F32)
    for kb in range(nb):
        acc = acc + partials[kb] * a_scale[:, kb : kb + 1] * b_scale_rows[:, kb][None, :]
    return acc


def linear_fp8(x: np.ndarray, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """FP8 weight (E4M3 values as fp32 [N, K], E8M0 scale per 32x32 tile as fp32
    [ceil(N/32), ceil(K/32)]); activation quantised per 32 along K; bf16 output."""
    lead = x.shape[:-1]
    x2 = np.asarray(x, F32).reshape(-1, x.shape[-1])
    q, s = fp8_act_quant(x2)
    n = weight.shape[0]
    b_scale_rows = np.repeat(scale, FP8_BLOCK, axis=0)[:n]  # [N, K/32]
    out = _block_scaled_gemm(q, s, weight, b_scale_rows)
    return bf16(out).reshape(*lead, n)


def linear_fp4(x: np.ndarray, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """FP4 expert weight (E2M1 values as fp32 [N, K], E8M0 scale per row per 32 along K as fp32
    [N, K/32]); FP8 activation with block 32; bf16 output."""
    lead = x.shape[:-1]
    x2 = np.asarray(x, F32).reshape(-1, x.shape[-1])
    q, s = fp8_act_quant(x2)
    out = _block_scaled_gemm(q, s, weight, scale)
    return bf16(out).reshape(*lead, weight.shape[0])


def linear_bf16(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """bf16 x bf16 F.linear: fp32 accumulation, bf16 output."""
    return bf16(f32(np.asarray(x, F64) @ np.asarray(weight, F64).T))


def linear_f32(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """fp32 F.linear (router, mHC mixes, compressor ratio 2, head): fp32 output."""
    return f32(np.asarray(x, F64) @ np.asarray(weight, F64).T)


# ---------------------------------------------------------------------------------------------
# Norms, activations


def mean_sq(x: np.ndarray) -> np.ndarray:
    """fp32 mean of squares over the last dim (exact sum in float64, one rounding)."""
    xf = np.asarray(x, F64)
    return f32(np.mean(f32(xf * xf).astype(F64), axis=-1))


def rsqrt(x: np.ndarray) -> np.ndarray:
    """fp32 1/sqrt(x), correctly rounded."""
    return f32(1.0 / np.sqrt(np.asarray(x, F32).astype(F64)))


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """y = bf16(w * (x * rsqrt(mean(x^2) + eps))), all fp32."""
    x = np.asarray(x, F32)
    r = rsqrt(mean_sq(x) + F32(eps))
    return bf16(np.asarray(weight, F32) * (x * r[..., None]))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """fp32 sigmoid, correctly rounded (via float64)."""
    return f32(1.0 / (1.0 + np.exp(-np.asarray(x, F32).astype(F64))))


def exp32(x: np.ndarray) -> np.ndarray:
    """fp32 exp, correctly rounded (via float64); exp(-inf) = 0."""
    with np.errstate(over="ignore", invalid="ignore"):
        return f32(np.exp(np.asarray(x, F32).astype(F64)))


def silu(x: np.ndarray) -> np.ndarray:
    """fp32 x * sigmoid(x) (torch computes x / (1 + exp(-x)))."""
    xd = np.asarray(x, F32).astype(F64)
    with np.errstate(over="ignore"):
        return f32(xd / (1.0 + np.exp(-xd)))


def softplus(x: np.ndarray) -> np.ndarray:
    """torch F.softplus (beta 1, threshold 20): x above 20, else log1p(exp(x)); fp32."""
    x = np.asarray(x, F32)
    with np.errstate(over="ignore"):
        soft = f32(np.log1p(np.exp(x.astype(F64))))
    return np.where(x > F32(20.0), x, soft).astype(F32)


# ---------------------------------------------------------------------------------------------
# RoPE (spec 2.5)


def rope_inv_freq(rope_dim: int, base: float, original_seq_len: int, factor: float, beta_fast: float,
                  beta_slow: float) -> np.ndarray:
    """fp32 inverse frequencies, with the YaRN correction (no mscale) when original_seq_len > 0."""
    exps = (np.arange(0, rope_dim, 2, dtype=F32) / F32(rope_dim)).astype(F32)
    freqs = (F32(1.0) / np.power(F32(base), exps, dtype=F32)).astype(F32)
    if original_seq_len > 0:
        import math

        def corrected_dim(rotations: float) -> float:
            return rope_dim * math.log(original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(corrected_dim(beta_fast)), 0)
        high = min(math.ceil(corrected_dim(beta_slow)), rope_dim - 1)
        ramp = np.clip((np.arange(rope_dim // 2, dtype=F32) - F32(low)) / F32(max(high - low, 1e-3)), 0, 1)
        ramp = ramp.astype(F32)
        smooth = (F32(1) - ramp).astype(F32)
        freqs = (freqs / F32(factor) * (F32(1) - smooth) + freqs * smooth).astype(F32)
    return freqs


def rope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Angles fp32(pos) * inv_freq in fp32 (torch.outer), cos/sin correctly rounded to fp32."""
    angles = (np.asarray(positions, dtype=np.int64).astype(F32)[:, None] * inv_freq[None, :]).astype(F32)
    a64 = angles.astype(F64)
    return f32(np.cos(a64)), f32(np.sin(a64))


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, inverse: bool = False) -> np.ndarray:
    """Rotate interleaved pairs (2i, 2i+1) of the last `2 * cos.shape[-1]` dims as complex numbers;
    x is [S, ..., D] (bf16 values), cos/sin are [S, rope/2]. Returns a new bf16 array."""
    rd = cos.shape[-1] * 2
    x = np.asarray(x, F32)
    out = x.copy()
    pairs = x[..., -rd:].reshape(*x.shape[:-1], rd // 2, 2)
    re, im = pairs[..., 0], pairs[..., 1]
    extra = (1,) * (x.ndim - 2)
    c = cos.reshape(cos.shape[0], *extra, rd // 2)
    s = sin.reshape(sin.shape[0], *extra, rd // 2)
    if inverse:
        s = -s
    new_re = (re * c - im * s).astype(F32)
    new_im = (re * s + im * c).astype(F32)
    out[..., -rd:] = bf16(np.stack([new_re, new_im], axis=-1).reshape(*x.shape[:-1], rd))
    return out


# ---------------------------------------------------------------------------------------------
# Sparse attention (spec 2.6)


def sparse_attn(q: np.ndarray, kv: np.ndarray, sink: np.ndarray, idx: np.ndarray, scale: float) -> np.ndarray:
    """q [S, H, D] bf16, kv [N, D] bf16 (K = V), sink [H] fp32, idx [S, T] (-1 = empty).
    Online softmax over index blocks of 64 in the given order: running max starts at -1e30,
    probabilities relative to the running max are rounded to bf16 before the PV product, the fp32
    unrounded ones feed the denominator, the sink adds exp(sink - max) at the end. bf16 output."""
    s_len, n_heads, dim = q.shape
    t_len = idx.shape[1]
    scale32 = F32(scale)
    q64 = np.asarray(q, F64)
    acc_o = np.zeros((s_len, n_heads, dim), dtype=F32)
    sum_exp = np.zeros((s_len, n_heads), dtype=F32)
    scores_max = np.full((s_len, n_heads), F32(-1e30), dtype=F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for t0 in range(0, t_len, SPARSE_ATTN_BLOCK):
            blk = idx[:, t0 : t0 + SPARSE_ATTN_BLOCK]  # [S, b]
            valid = blk != -1
            kv_blk = np.asarray(kv, F32)[np.maximum(blk, 0)] * valid[..., None]  # [S, b, D]
            logits = f32(np.einsum("shd,sbd->shb", q64, kv_blk.astype(F64)))  # [S, H, b]
            logits = np.where(valid[:, None, :], logits, F32(-np.inf)).astype(F32) * scale32
            prev_max = scores_max
            scores_max = np.maximum(prev_max, logits.max(-1)).astype(F32)
            rescale = exp32(prev_max - scores_max)  # [S, H]
            p = exp32(logits - scores_max[..., None])  # [S, H, b]
            sum_exp = (sum_exp * rescale + f32(p.astype(F64).sum(-1))).astype(F32)
            pv = f32(np.einsum("shb,sbd->shd", bf16(p).astype(F64), kv_blk.astype(F64)))
            acc_o = (acc_o * rescale[..., None] + pv).astype(F32)
        sum_exp = (sum_exp + exp32(np.asarray(sink, F32)[None, :] - scores_max)).astype(F32)
        return bf16((acc_o / sum_exp[..., None]).astype(F32))


# ---------------------------------------------------------------------------------------------
# Hyper-connections (spec 2.7, 4.2)


def hc_split_sinkhorn(mixes: np.ndarray, hc_scale: np.ndarray, hc_base: np.ndarray, hc: int, iters: int,
                      eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """mixes [..., (2+hc)*hc] fp32 -> pre [..., hc], post [..., hc], comb [..., hc, hc] (comb[j][k]:
    row j = input stream, column k = output stream). Same fp32 operation order as the kernel."""
    m = np.asarray(mixes, F32)
    sc = np.asarray(hc_scale, F32)
    base = np.asarray(hc_base, F32)
    eps32 = F32(eps)
    pre = (sigmoid((m[..., :hc] * sc[0] + base[:hc]).astype(F32)) + eps32).astype(F32)
    post = (F32(2) * sigmoid((m[..., hc : 2 * hc] * sc[1] + base[hc : 2 * hc]).astype(F32))).astype(F32)
    comb = (m[..., 2 * hc :] * sc[2] + base[2 * hc :]).astype(F32).reshape(*m.shape[:-1], hc, hc)
    comb = exp32(comb - comb.max(-1, keepdims=True))
    comb = (comb / sum_seq(comb, -1) + eps32).astype(F32)
    comb = (comb / (sum_seq(comb, -2) + eps32)).astype(F32)
    for _ in range(iters - 1):
        comb = (comb / (sum_seq(comb, -1) + eps32)).astype(F32)
        comb = (comb / (sum_seq(comb, -2) + eps32)).astype(F32)
    return pre, post, comb


def sum_seq(x: np.ndarray, axis: int) -> np.ndarray:
    """fp32 sum over a short axis, added left to right, keepdims."""
    x = np.moveaxis(np.asarray(x, F32), axis, -1)
    acc = x[..., 0].copy()
    for i in range(1, x.shape[-1]):
        acc = (acc + x[..., i]).astype(F32)
    return np.expand_dims(acc, axis)


def hc_pre(streams: np.ndarray, pre_mix: np.ndarray) -> np.ndarray:
    """streams [S, hc, D] bf16, pre_mix [S, hc] fp32 -> bf16(sum_j a_j * X_j) [S, D]."""
    acc = (pre_mix[:, 0, None] * streams[:, 0]).astype(F32)
    for j in range(1, streams.shape[1]):
        acc = (acc + pre_mix[:, j, None] * streams[:, j]).astype(F32)
    return bf16(acc)


def hc_post(y: np.ndarray, residual: np.ndarray, post: np.ndarray, comb: np.ndarray) -> np.ndarray:
    """y [S, D] bf16, residual [S, hc, D] bf16, post [S, hc], comb [S, hc, hc] ->
    bf16(post_k * y + sum_j comb[j][k] * R_j) [S, hc, D]."""
    hc = residual.shape[1]
    out = np.empty_like(residual, dtype=F32)
    for k in range(hc):
        mixed = (comb[:, 0, k, None] * residual[:, 0]).astype(F32)
        for j in range(1, hc):
            mixed = (mixed + comb[:, j, k, None] * residual[:, j]).astype(F32)
        out[:, k] = (post[:, k, None] * y + mixed).astype(F32)
    return bf16(out)


def hc_mixes(streams: np.ndarray, fn: np.ndarray, scale: np.ndarray, base: np.ndarray, norm_eps: float,
             hc: int, iters: int, hc_eps: float):
    """One RMS statistic per token over the flattened hc*D stream; mixes = (X . fn^T) * rsqrt."""
    flat = np.asarray(streams, F32).reshape(streams.shape[0], -1)  # [S, hc*D]
    r = rsqrt(mean_sq(flat) + F32(norm_eps))  # [S]
    mixes = (linear_f32(flat, fn) * r[:, None]).astype(F32)  # [S, (2+hc)*hc]
    return hc_split_sinkhorn(mixes, scale, base, hc, iters, hc_eps)


# ---------------------------------------------------------------------------------------------
# Top-k with a fixed tie rule


def topk_lowest_index(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k along the last axis, ties broken by the lower index. Returns (indices in descending
    score order [.., k], boundary value [..]) where the boundary value is the k-th score."""
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    return order, np.take_along_axis(scores, order[..., -1:], axis=-1)[..., 0]
