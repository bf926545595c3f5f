#!/usr/bin/env python3
"""The vision path of the official reference (inference/vision.py: ViT + Aligner), in numpy.

  vision_reference.py CKPT_DIR OUT_JSON

Written from the semantics of the official `ViT` and `Aligner` (tt-metal's vendored copy of
deepseek_v41/vision.py), with the golden's numerics contract (docs/GOLDEN.md section 2.2; the rules
this path adds are in its "Vision" section). Shares no code with cedar.

The input of each case is a patch grid as the official processor produces it: bf16 values
(v/255 - 0.5)/0.5 of a fixed pattern of pixel bytes (`make_patches`), in its layout [n_h * n_w, 3 * p * p]
(channel, row, column inside a patch). The output JSON records, per case, every block's output,
the final norm and the aligner's output as sha256 of their float32 bytes (little-endian, values all
bf16) plus the first 8 values and the sum, so an engine can show it is bit-identical.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numerics as nx  # noqa: E402
from checkpoint import Weights  # noqa: E402

F32, F64 = np.float32, np.float64
RMS_EPS = 1e-6  # vision.py RMSNorm default (not the backbone's 1e-20)
# The patch grids the goldens cover: square, wide, tall, one patch, and sizes that are not
# multiples of the 3x3 merge (the aligner zero-pads right and bottom).
GRIDS = [(1, 1), (3, 3), (2, 5), (5, 2), (4, 7), (6, 6)]


def make_patches(n_h: int, n_w: int, p: int, salt: int) -> np.ndarray:
    """The processor's output for a fixed pixel pattern (the C++ test draws the same bytes)."""
    rows, cols = n_h * p, n_w * p
    pixels = np.zeros((3, rows, cols), dtype=np.int64)
    for c in range(3):
        r, q = np.mgrid[0:rows, 0:cols]
        pixels[c] = (r * 37 + q * 11 + c * 101 + (r * q) % 7 + n_w * 5 + salt * 13) % 256
    x = pixels.astype(F32) / F32(255)
    x = nx.bf16(((x - F32(0.5)) / F32(0.5)).astype(F32))
    return x.reshape(3, n_h, p, n_w, p).transpose(1, 3, 0, 2, 4).reshape(n_h * n_w, 3 * p * p)


class VisionArgs:
    def __init__(self, config: dict):
        v = config["vision_config"]
        self.n_layers = v["num_hidden_layers"]
        self.dim = v["hidden_size"]
        self.n_heads = v["num_attention_heads"]
        self.inter_dim = v["intermediate_size"]
        self.patch = v["patch_size"]
        self.theta = float(v.get("rope_theta", 10000))
        self.downsample = v["downsample_ratio"]
        text = config.get("text_config", config)
        self.llm_dim = text["hidden_size"]


def linear_bias(x, weight, bias):
    """bf16 nn.Linear with bias: exact dot -> fp32, + bias in fp32, one rounding to bf16."""
    return nx.bf16((nx.f32(np.asarray(x, F64) @ np.asarray(weight, F64).T) + np.asarray(bias, F32)).astype(F32))


def vision_cos_sin(n_h: int, n_w: int, rope_dim: int, theta: float):
    """get_vision_cos_sin: inv_freq over rope_dim (fp32, theta ** t correctly rounded, 1/x in fp32),
    angles = row * inv_freq then column * inv_freq (fp32 products), cos/sin correctly rounded."""
    t = (np.arange(0, rope_dim, 2, dtype=F32) / F32(rope_dim)).astype(F32)
    inv_freq = (F32(1.0) / nx.f32(np.power(F64(theta), t.astype(F64)))).astype(F32)
    rows = np.repeat(np.arange(n_h), n_w).astype(F32)
    cols = np.tile(np.arange(n_w), n_h).astype(F32)
    angles = np.concatenate([rows[:, None] * inv_freq[None, :], cols[:, None] * inv_freq[None, :]], axis=1).astype(F32)
    a64 = angles.astype(F64)
    return nx.f32(np.cos(a64)), nx.f32(np.sin(a64))


def apply_rotary(x, cos, sin):
    """Rotate-half over the whole head: [x1 c - x2 s, x2 c + x1 s] in fp32, then bf16. x [n, H, D]."""
    half = x.shape[-1] // 2
    x1, x2 = np.asarray(x[..., :half], F32), np.asarray(x[..., half:], F32)
    c, s = cos[:, None, :], sin[:, None, :]
    lo = (x1 * c).astype(F32) - (x2 * s).astype(F32)
    hi = (x2 * c).astype(F32) + (x1 * s).astype(F32)
    return nx.bf16(np.concatenate([lo.astype(F32), hi.astype(F32)], axis=-1))


def attention(q, k, v):
    """Bidirectional softmax attention per head, scale 1/sqrt(head_dim). q, k, v [n, H, D] bf16.
    Contract: logits = fp32(exact q.k) * scale; p = exp(logit - max) correctly rounded; denominator
    float64 sum of the fp32 p -> fp32; p rounded to bf16 for the PV product (as flash attention and the
    backbone's sparse_attn feed bf16 probabilities to it); output fp32(exact sum bf16(p) * v) /
    denominator in fp32, then bf16."""
    scale = F32(1.0 / math.sqrt(q.shape[-1]))
    logits = (nx.f32(np.einsum("ihd,jhd->hij", q.astype(F64), k.astype(F64))) * scale).astype(F32)
    m = logits.max(axis=-1, keepdims=True)
    p = nx.exp32((logits - m).astype(F32))
    denom = nx.f32(p.astype(F64).sum(-1))
    pv = nx.f32(np.einsum("hij,jhd->hid", nx.bf16(p).astype(F64), v.astype(F64)))
    out = (pv / denom[..., None]).astype(F32)
    return nx.bf16(out).transpose(1, 0, 2)  # [n, H, D]


def silu_mul(gate, up):
    """F.silu(gate) * up on bf16 tensors: silu rounded to bf16, then the product rounded to bf16."""
    return nx.bf16((nx.bf16(nx.silu(gate)) * up).astype(F32))


def add_bf16(a, b):
    return nx.bf16((np.asarray(a, F32) + np.asarray(b, F32)).astype(F32))


def gelu_exact(x):
    """F.gelu (erf form) on bf16: 0.5 x (1 + erf(x / sqrt 2)) in float64, rounded once to fp32, then bf16."""
    xd = np.asarray(x, F32).astype(F64)
    erf = np.vectorize(math.erf)(xd / math.sqrt(2.0))
    return nx.bf16(nx.f32(0.5 * xd * (1.0 + erf)))


class Vision:
    def __init__(self, w: Weights, a: VisionArgs):
        self.a = a
        bf = ("BF16",)
        vd, p = a.dim, a.patch
        self.embed_w = w.array("vision.patch_embed.proj.weight", (vd, 3 * p * p), bf)
        self.embed_b = w.array("vision.patch_embed.proj.bias", (vd,), bf)
        self.blocks = []
        for i in range(a.n_layers):
            pre = f"vision.blocks.{i}"
            self.blocks.append(dict(
                norm1=w.array(pre + ".norm1.weight", (vd,), ("BF16", "F32")),
                wqkv=w.array(pre + ".attn.wqkv.weight", (3 * vd, vd), bf),
                wqkv_b=w.array(pre + ".attn.wqkv.bias", (3 * vd,), bf),
                wo=w.array(pre + ".attn.wo.weight", (vd, vd), bf),
                wo_b=w.array(pre + ".attn.wo.bias", (vd,), bf),
                norm2=w.array(pre + ".norm2.weight", (vd,), ("BF16", "F32")),
                w1=w.array(pre + ".mlp.w1.weight", (2 * a.inter_dim, vd), bf),
                w2=w.array(pre + ".mlp.w2.weight", (vd, a.inter_dim), bf),
            ))
        self.norm = w.array("vision.norm.weight", (vd,), ("BF16", "F32"))
        r = a.downsample
        self.al_w1 = w.array("aligner.w1.weight", (a.llm_dim, vd * r * r), bf)
        self.al_b1 = w.array("aligner.w1.bias", (a.llm_dim,), bf)
        self.al_w2 = w.array("aligner.w2.weight", (a.llm_dim, a.llm_dim), bf)
        self.al_b2 = w.array("aligner.w2.bias", (a.llm_dim,), bf)

    def vit(self, patches, n_h, n_w, record):
        a = self.a
        n, heads, hd = patches.shape[0], a.n_heads, a.dim // a.n_heads
        x = linear_bias(patches, self.embed_w, self.embed_b)
        record("patch_embed", x)
        cos, sin = vision_cos_sin(n_h, n_w, hd // 2, a.theta)
        for i, b in enumerate(self.blocks):
            h = nx.rms_norm(x, b["norm1"], RMS_EPS)
            qkv = linear_bias(h, b["wqkv"], b["wqkv_b"])
            q, k, v = (qkv[:, j * a.dim:(j + 1) * a.dim].reshape(n, heads, hd) for j in range(3))
            o = attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v).reshape(n, a.dim)
            x = add_bf16(x, linear_bias(o, b["wo"], b["wo_b"]))
            h = nx.rms_norm(x, b["norm2"], RMS_EPS)
            g = nx.linear_bf16(h, b["w1"])
            x = add_bf16(x, nx.linear_bf16(silu_mul(g[:, :a.inter_dim], g[:, a.inter_dim:]), b["w2"]))
            record(f"block{i}", x)
        x = nx.rms_norm(x, self.norm, RMS_EPS)
        record("norm", x)
        return x

    def aligner(self, x, n_h, n_w):
        """View as [n_h, n_w, C], zero-pad bottom/right to multiples of r, r x r stride-r unfold
        (feature index c * r * r + ki * r + kj, blocks in reading order), w2(gelu(w1(.)))."""
        r, c = self.a.downsample, x.shape[-1]
        g_h, g_w = -(-n_h // r), -(-n_w // r)
        grid = np.zeros((g_h * r, g_w * r, c), F32)
        grid[:n_h, :n_w] = x.reshape(n_h, n_w, c)
        blocks = grid.reshape(g_h, r, g_w, r, c).transpose(0, 2, 4, 1, 3).reshape(g_h * g_w, c * r * r)
        h = gelu_exact(linear_bias(blocks, self.al_w1, self.al_b1))
        return linear_bias(h, self.al_w2, self.al_b2)


def summary(x):
    x = np.ascontiguousarray(np.asarray(x, F32))
    return {"shape": list(x.shape), "sha256": hashlib.sha256(x.astype("<f4").tobytes()).hexdigest(),
            "first8": [float(v) for v in x.reshape(-1)[:8]], "sum": float(x.astype(F64).sum())}


def main():
    ckpt, out_path = sys.argv[1], sys.argv[2]
    with open(os.path.join(ckpt, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    args = VisionArgs(config)
    vision = Vision(Weights(ckpt), args)
    cases = []
    for salt, (n_h, n_w) in enumerate(GRIDS):
        patches = make_patches(n_h, n_w, args.patch, salt)
        outputs = {}
        x = vision.vit(patches, n_h, n_w, lambda name, v: outputs.__setitem__(name, summary(v)))
        outputs["aligner"] = summary(vision.aligner(x, n_h, n_w))
        cases.append({"n_h": n_h, "n_w": n_w, "salt": salt, "patches": summary(patches), "outputs": outputs})
    doc = {"what": "tools/golden/vision_reference.py: ViT + Aligner of inference/vision.py on patch grids",
           "checkpoint": {"config_sha256": hashlib.sha256(open(os.path.join(ckpt, "config.json"), "rb").read()).hexdigest(),
                          "vision": vars(args)},
           "pixel_byte": "(row*37 + col*11 + channel*101 + (row*col)%7 + n_w*5 + salt*13) % 256",
           "cases": cases}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
