"""DeepSeek-V4.1 at small scale, in torch, for training cedar-mini.

The forward pass is the official reference's prefill (a whole sequence at start_pos 0; the numpy
port in tools/golden/reference_forward.py reads the same way), made differentiable:

* single-pass mHC: `hc_mult` residual streams, the Sinkhorn-projected mixes of one site feed the
  next site's input (the attention reads the previous FFN's pre-mix), as the reference does;
* attention modes from the layer plan: SWA-only, KV sources (Full: a compressor and index keys;
  ratio 2 in the encoder, ratio 1 for the decoder, whose compressed KV is a projection of the
  encoder output = the decoder's first layer input), Reindex (own indexer over the source's keys,
  restricted to the candidate pool), Reuse (the source's KV and the last indexer's top-k);
* the indexer's top-k is a hard selection (no gradient through it); the indexer is trained by a
  KL loss towards the main attention's mass over all visible compressed entries (the lightning-
  indexer distillation of DeepSeek's sparse attention), with its inputs detached;
* bias-balanced MoE routing (noaux_tc): the bias moves towards equal load after every step;
* Engram at its layers, hashed n-gram rows looked up from token ids;
* quantisation-aware training: the window KV is FP8-QDQ'd, the compressed KV FP4 (E4M3 scales),
  the index queries and keys FP4 (E8M0 scales), experts' weights FP4 and dense weights FP8
  (32x32 tiles), Engram rows FP8; each by a straight-through estimator, with the released formats'
  scale rules, so the exported checkpoint computes what was trained.

Activations stay fp32 (the reference rounds many of them to bf16 and quantises linear inputs to
FP8; those differences are of the size of cedar's fast numerics mode and are not trained for).
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))

import numerics as nx  # noqa: E402

FP8_MAX = 448.0
# torch.compile fuses the many small elementwise ops (mHC, norms, RoPE, quantisers) into a few
# loops: about 4x on those parts on a CPU. Off for export / evaluation scripts that prefer no warm-up.
COMPILE = os.environ.get("CEDAR_TRAIN_COMPILE", "1") == "1"


def fused(fn):
    return torch.compile(fn, dynamic=False) if COMPILE else fn

E2M1_MIDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


# ---------------------------------------------------------------------------------------------
# Quantise-dequantise with straight-through gradients


def ste(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Forward: q. Backward: identity to x."""
    return x + (q - x).detach()


def pow2_ceil(x: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.ceil(torch.log2(x)))


def e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def e2m1(v: torch.Tensor) -> torch.Tensor:
    """Values in [-6, 6] -> nearest E2M1 value (ties: even code, as the kernel's RNE)."""
    mag = v.abs()
    code = torch.bucketize(mag, E2M1_MIDS, right=False)  # count of mids strictly below
    tie_up = (mag == 0.75) | (mag == 1.75) | (mag == 3.5)
    code = code + tie_up.to(code.dtype)
    return torch.sign(v) * E2M1_GRID[code]


@fused
def fp8_qdq(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """act_quant: power-of-two scale per `block` values from the amax (floor 1e-4), E4M3."""
    with torch.no_grad():
        g = x.unflatten(-1, (-1, block))
        scale = pow2_ceil(g.abs().amax(-1, keepdim=True).clamp_min(1e-4) / FP8_MAX)
        q = (e4m3(g / scale) * scale).flatten(-2)
    return ste(x, q)


@fused
def fp4_qdq_e8m0(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    with torch.no_grad():
        g = x.unflatten(-1, (-1, block))
        scale = pow2_ceil(g.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0**-126) / 6.0)
        q = (e2m1((g / scale).clamp(-6, 6)) * scale).flatten(-2)
    return ste(x, q)


@fused
def fp4_qdq_e4m3(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    with torch.no_grad():
        g = x.unflatten(-1, (-1, block))
        scale = e4m3(g.abs().amax(-1, keepdim=True).clamp_min(6.0 * 2.0**-9) / 6.0)
        q = (e2m1((g / scale).clamp(-6, 6)) * scale).flatten(-2)
    return ste(x, q)


@fused
def fp8_weight_qdq(w: torch.Tensor, rows_per_scale: int = 32) -> torch.Tensor:
    """E4M3 weight, one power-of-two scale per 32x32 tile (per row x 32 for Engram tables)."""
    with torch.no_grad():
        n, k = w.shape[-2:]
        g = w.reshape(*w.shape[:-2], n // rows_per_scale, rows_per_scale, k // 32, 32)
        amax = g.abs().amax(dim=(-3, -1), keepdim=True).clamp_min(1e-30)
        scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)).clamp(-120, 120))
        q = (e4m3(g / scale) * scale).reshape(w.shape)
    return ste(w, q)


@fused
def fp4_weight_qdq(w: torch.Tensor) -> torch.Tensor:
    """E2M1 weight, one power-of-two scale per row per 32 along K (the released expert format)."""
    with torch.no_grad():
        g = w.unflatten(-1, (-1, 32))
        amax = g.abs().amax(-1, keepdim=True).clamp_min(1e-30)
        scale = torch.exp2(torch.ceil(torch.log2(amax / 6.0)).clamp(-120, 120))
        q = (e2m1((g / scale).clamp(-6, 6)) * scale).flatten(-2)
    return ste(w, q)


def bf16_qdq(w: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        q = w.to(torch.bfloat16).to(torch.float32)
    return ste(w, q)


# ---------------------------------------------------------------------------------------------
# Small pieces


@fused
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@fused
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate interleaved pairs of the last 2*cos.shape[-1] dims; cos/sin broadcast against x."""
    rd = cos.shape[-1] * 2
    head, tail = x[..., :-rd], x[..., -rd:].unflatten(-1, (rd // 2, 2))
    re, im = tail[..., 0], tail[..., 1]
    s = -sin if inverse else sin
    rot = torch.stack([re * cos - im * s, re * s + im * cos], -1).flatten(-2)
    return torch.cat([head, rot], -1)


@fused
def hc_split_sinkhorn(m: torch.Tensor, scale, base, hc: int, iters: int, eps: float):
    pre = torch.sigmoid(m[..., :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(m[..., hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = (m[..., 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
    comb = torch.softmax(comb, -1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


@fused
def hc_pre(streams, pre):
    return (pre.unsqueeze(-1) * streams).sum(-2)


@fused
def hc_post(y, residual, post, comb):
    # out_k = post_k * y + sum_j comb[j][k] * R_j
    return post.unsqueeze(-1) * y.unsqueeze(-2) + (comb.unsqueeze(-1) * residual.unsqueeze(-2)).sum(-3)


@fused
def hc_mix_logits(streams, fn, norm_eps: float):
    flat = streams.flatten(-2)
    r = torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + norm_eps)
    return (flat @ fn.t()) * r


@fused
def attend(q, gathered, valid, sink, scale: float):
    """Softmax attention of q [B, T, H, D] over per-query keys (= values) [B, T, N, D] with the
    learned sink as an extra logit per head; invalid slots are masked."""
    logits = torch.einsum("bthd,btnd->bthn", q, gathered) * scale
    logits = logits.masked_fill(~valid[:, :, None, :], -math.inf)
    B, T, H = q.shape[:3]
    probs = torch.softmax(torch.cat([logits, sink.view(1, 1, H, 1).expand(B, T, H, 1)], -1), -1)[..., :-1]
    return torch.einsum("bthn,btnd->bthd", probs, gathered)


@fused
def engram_gate(streams, key, value, qk, norm_eps: float):
    d = streams.shape[-1]
    rstd = torch.rsqrt(streams.pow(2).mean(-1) + norm_eps) * torch.rsqrt(key.pow(2).mean(-1) + norm_eps)
    dot = (streams * qk * key).sum(-1) * rstd * d ** -0.5
    signed = torch.sign(dot) * torch.sqrt(dot.abs().clamp_min(1e-6))
    return streams + torch.sigmoid(signed).unsqueeze(-1) * value.unsqueeze(-2)


def init_linear(out_f: int, in_f: int, std: float | None = None) -> nn.Parameter:
    return nn.Parameter(torch.randn(out_f, in_f) * (std if std is not None else in_f ** -0.5))


# ---------------------------------------------------------------------------------------------
# The model


class Layer(nn.Module):
    def __init__(self, cfg, L: int, n_layers_total: int):
        super().__init__()
        c = cfg
        d, hd, hc = c.dim, c.head_dim, c.hc_mult
        mix = (2 + hc) * hc
        out_std = (2 * n_layers_total) ** -0.5
        self.L = L
        self.ratio = c.compress_ratios[L]
        self.kv_source = L in c.kv_source_layers
        self.index_source = L in c.index_source_layers
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.ffn_norm = nn.Parameter(torch.ones(d))
        for site in ("attn", "ffn"):
            setattr(self, f"hc_{site}_fn", nn.Parameter(torch.randn(mix, hc * d) * (hc * d) ** -0.5 * 0.1))
            setattr(self, f"hc_{site}_base", nn.Parameter(torch.zeros(mix)))
            setattr(self, f"hc_{site}_scale", nn.Parameter(torch.ones(3)))
        self.attn_sink = nn.Parameter(torch.zeros(c.n_heads))
        self.wq_a = init_linear(c.q_lora_rank, d)
        self.q_norm = nn.Parameter(torch.ones(c.q_lora_rank))
        self.wq_b = init_linear(c.n_heads * hd, c.q_lora_rank)
        self.wkv = init_linear(hd, d)
        self.kv_norm = nn.Parameter(torch.ones(hd))
        group_in = c.n_heads * hd // c.o_groups
        self.wo_a = init_linear(c.o_groups * c.o_lora_rank, group_in)
        self.wo_b = init_linear(d, c.o_groups * c.o_lora_rank, (c.o_groups * c.o_lora_rank) ** -0.5 * out_std)
        if self.kv_source:
            self.cmp_wkv = init_linear(hd, d)
            if self.ratio > 1:
                self.cmp_wgate = init_linear(hd, d, d ** -0.5 * 0.1)
            self.cmp_norm = nn.Parameter(torch.ones(hd))
            self.idx_wk = init_linear(c.index_head_dim, hd)
            self.idx_k_norm = nn.Parameter(torch.ones(c.index_head_dim))
        if self.index_source:
            self.idx_wq_b = init_linear(c.index_n_heads * c.index_head_dim, c.q_lora_rank)
            self.idx_weights_proj = init_linear(c.index_n_heads, d)
        E, inter = c.n_routed_experts, c.moe_inter_dim
        self.gate_w = init_linear(E, d)
        self.register_buffer("gate_b", torch.zeros(E))
        self.register_buffer("load", torch.zeros(E), persistent=False)
        self.w1 = nn.Parameter(torch.randn(E, inter, d) * d ** -0.5)
        self.w3 = nn.Parameter(torch.randn(E, inter, d) * d ** -0.5)
        self.w2 = nn.Parameter(torch.randn(E, d, inter) * inter ** -0.5 * out_std)
        self.sw1 = init_linear(inter, d)
        self.sw3 = init_linear(inter, d)
        self.sw2 = init_linear(d, inter, inter ** -0.5 * out_std)
        self.engram = L in c.engram_layer_ids
        if self.engram:
            i = c.engram_layer_ids.index(L)
            rows, ehd = c.engram_num_embeddings[i], c.engram_head_dim
            n_cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads
            self.eng_table = nn.Parameter(torch.randn(rows, ehd))
            self.eng_wkv = init_linear(d * (hc + 1), n_cols * ehd, (n_cols * ehd) ** -0.5 * 0.5)
            self.eng_qk = nn.Parameter(torch.ones(hc, d))


class MiniV41(nn.Module):
    """Parameters named after the released tensors they export to (export.py maps them)."""

    def __init__(self, cfg, head_ids: np.ndarray, embed_ids: np.ndarray):
        super().__init__()
        self.cfg = c = cfg
        self.hc = c.hc_mult
        # The head is trained over `head_ids` only; every other vocabulary row exports as zero,
        # so its logit is exactly 0. The loss keeps them: log-sum-exp adds (vocab - n) * e^0.
        self.register_buffer("head_ids", torch.as_tensor(head_ids, dtype=torch.long))
        head_slot = torch.full((c.vocab_size,), -1, dtype=torch.long)
        head_slot[self.head_ids] = torch.arange(len(head_ids))
        self.register_buffer("head_slot", head_slot)
        self.log_zero_rows = math.log(c.vocab_size - len(head_ids))
        # Input rows: one per token id seen in training, plus a shared row (index 0) for the rest.
        self.register_buffer("embed_ids", torch.as_tensor(embed_ids, dtype=torch.long))
        embed_slot = torch.zeros(c.vocab_size, dtype=torch.long)
        embed_slot[self.embed_ids] = torch.arange(1, len(embed_ids) + 1)
        self.register_buffer("embed_slot", embed_slot)
        self.embed = nn.Parameter(torch.randn(len(embed_ids) + 1, c.dim))
        self.head = nn.Parameter(torch.randn(len(head_ids), c.dim) * c.dim ** -0.5)
        self.norm = nn.Parameter(torch.ones(c.dim))
        self.layers = nn.ModuleList([Layer(c, L, c.n_layers) for L in range(c.n_layers)])
        self.inv_swa = torch.from_numpy(nx.rope_inv_freq(c.rope_head_dim, c.rope_theta, 0, 1.0, 32, 1))
        self.inv_cmp = torch.from_numpy(nx.rope_inv_freq(c.rope_head_dim, c.compress_rope_theta, c.original_seq_len,
                                                         c.rope_factor, c.beta_fast, c.beta_slow))

    # -----------------------------------------------------------------------------------------

    def rope_table(self, L: int, positions: torch.Tensor):
        inv = self.inv_cmp if self.cfg.compress_ratios[L] else self.inv_swa
        ang = positions.to(torch.float32)[:, None] * inv[None, :]
        return torch.cos(ang), torch.sin(ang)

    def hc_mixes(self, streams, fn, scale, base):
        c = self.cfg
        mixes = hc_mix_logits(streams, fn, c.norm_eps)
        return hc_split_sinkhorn(mixes, scale, base, c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps)

    hc_pre = staticmethod(lambda streams, pre: hc_pre(streams, pre))
    hc_post = staticmethod(lambda y, residual, post, comb: hc_post(y, residual, post, comb))

    # -----------------------------------------------------------------------------------------
    # Attention

    def compressor(self, lw: Layer, x: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        wkv = bf16_qdq(lw.cmp_wkv)
        if lw.ratio == 1:
            return rms_norm(x @ wkv.t(), lw.cmp_norm, c.norm_eps)
        B, T, _ = x.shape
        cut = T - T % lw.ratio
        kv = (x[:, :cut] @ wkv.t()).unflatten(1, (-1, lw.ratio))
        score = (x[:, :cut] @ bf16_qdq(lw.cmp_wgate).t()).unflatten(1, (-1, lw.ratio))
        pooled = (kv * torch.softmax(score, 2)).sum(2)
        return rms_norm(pooled, lw.cmp_norm, c.norm_eps)

    def index_scores(self, lw: Layer, x, qr, keys, cos, sin) -> torch.Tensor:
        c = self.cfg
        B, T, _ = x.shape
        q = (qr.detach() @ fp8_weight_qdq(lw.idx_wq_b).t()).unflatten(-1, (c.index_n_heads, c.index_head_dim))
        q = fp4_qdq_e8m0(rope(q, cos[:, None], sin[:, None]))
        w = x.detach() @ bf16_qdq(lw.idx_weights_proj).t() * (c.index_head_dim ** -0.5 * c.index_n_heads ** -0.5)
        dots = torch.einsum("bthd,bnd->bthn", q, keys)
        return (F.relu(dots) * w.unsqueeze(-1)).sum(2)  # [B, T, C]

    def candidate_mask(self, score: torch.Tensor, visible_len: torch.Tensor) -> torch.Tensor:
        """The candidate source's block mask: the best `candidate_topk_blocks` blocks of
        `candidate_block_size` entries by max score, the newest visible block always kept."""
        c = self.cfg
        B, T, C = score.shape
        bs = c.candidate_block_size
        pad = (-C) % bs
        s = F.pad(score, (0, pad), value=-math.inf)
        blocks = s.unflatten(-1, (-1, bs)).amax(-1)  # [B, T, nb]
        nb = blocks.shape[-1]
        last = (visible_len - 1).div(bs, rounding_mode="floor")  # [T]
        blocks = torch.where(torch.arange(nb)[None, None, :] == last[None, :, None],
                             torch.full_like(blocks, math.inf), blocks)
        k = min(c.candidate_topk_blocks, nb)
        top = blocks.topk(k, -1)
        keep = torch.zeros_like(blocks, dtype=torch.bool).scatter(-1, top.indices, top.values > -math.inf)
        return keep.repeat_interleave(bs, -1)[..., :C]

    def attention(self, lw: Layer, x: torch.Tensor, shared: dict, aux: dict) -> torch.Tensor:
        """Each query attends its window (the last `window_size` positions, its own included) and,
        in compressed layers, the top-k compressed entries picked by the last indexer: the keys are
        gathered per query, so the cost is (window + top-k) per query, not the sequence length."""
        c = self.cfg
        B, T, _ = x.shape
        H, hd = c.n_heads, c.head_dim
        pos = torch.arange(T)
        cos, sin = self.rope_table(lw.L, pos)
        qr = rms_norm(x @ fp8_weight_qdq(lw.wq_a).t(), lw.q_norm, c.norm_eps)
        q = (qr @ fp8_weight_qdq(lw.wq_b).t()).unflatten(-1, (H, hd))
        q = rope(q, cos[:, None], sin[:, None])
        kv = rms_norm(x @ fp8_weight_qdq(lw.wkv).t(), lw.kv_norm, c.norm_eps)
        kv = fp8_qdq(rope(kv, cos, sin))  # the window KV is stored FP8
        win = min(c.window_size, T)
        idx = pos[:, None] - (win - 1) + torch.arange(win)[None, :]  # [T, win] window positions
        valid = (idx >= 0).expand(B, T, win)
        idx = idx.clamp_min(0).expand(B, T, win)
        keys = kv
        if lw.ratio:
            ratio = lw.ratio
            n_cmp = T // ratio
            visible_len = (pos + 1).div(ratio, rounding_mode="floor")  # entries visible to each query
            visible = torch.arange(n_cmp)[None, :] < visible_len[:, None]  # [T, C]
            if lw.kv_source:
                latent = self.compressor(lw, x)  # [B, C, hd]
                gpos = torch.arange(0, n_cmp * ratio, ratio)
                gcos, gsin = self.rope_table(lw.L, gpos)
                shared["kv"] = fp4_qdq_e4m3(rope(latent, gcos, gsin), 16)
                ik = rms_norm(latent.detach() @ bf16_qdq(lw.idx_wk).t(), lw.idx_k_norm, c.norm_eps)
                shared["index_k"] = fp4_qdq_e8m0(rope(ik, gcos, gsin))
            cmp_kv = shared["kv"]
            if lw.index_source:
                score = self.index_scores(lw, x, qr, shared["index_k"], cos, sin)
                score = score.masked_fill(~visible, -math.inf)
                aux.setdefault("index", []).append((lw.L, score, visible))
                if lw.L == c.candidate_source_layer:
                    shared["candidates"] = self.candidate_mask(score.detach(), visible_len)
                elif 0 <= c.candidate_source_layer < lw.L:
                    score = score.masked_fill(~shared["candidates"], -math.inf)
                k = min(c.index_topk, n_cmp)
                top = score.detach().topk(k, -1).indices  # [B, T, k]
                shared["sel"] = top
                shared["sel_valid"] = top < visible_len[None, :, None]
                with torch.no_grad():
                    # The indexer's target: this layer's attention mass over every visible
                    # compressed entry (dense, detached), averaged over heads.
                    cl = torch.einsum("bthd,bnd->bthn", q.detach(), cmp_kv.detach()) * hd ** -0.5
                    cl = cl.masked_fill(~visible[None, :, None, :], -math.inf)
                    aux.setdefault("index_target", []).append(torch.softmax(cl, -1).nan_to_num(0.0).mean(2))
            keys = torch.cat([kv, cmp_kv], 1)
            idx = torch.cat([idx, shared["sel"] + T], -1)
            valid = torch.cat([valid, shared["sel_valid"]], -1)
        gathered = keys[torch.arange(B)[:, None, None], idx]  # [B, T, N, hd]
        o = attend(q, gathered, valid, lw.attn_sink, hd ** -0.5)
        o = rope(o, cos[:, None], sin[:, None], inverse=True)
        o = o.reshape(B, T, c.o_groups, -1)
        wo_a = fp8_weight_qdq(lw.wo_a).view(c.o_groups, c.o_lora_rank, -1)
        t = torch.einsum("btgi,gri->btgr", o, wo_a).flatten(-2)
        return t @ fp8_weight_qdq(lw.wo_b).t()

    # -----------------------------------------------------------------------------------------
    # MoE, Engram

    def moe(self, lw: Layer, x: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = x @ bf16_qdq(lw.gate_w).t()
        scores = torch.sqrt(F.softplus(logits))
        chosen = (scores.detach() + lw.gate_b).topk(c.n_activated_experts, -1).indices  # [N, k]
        weights = scores.gather(1, chosen)
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * c.route_scale
        with torch.no_grad():
            lw.load += torch.bincount(chosen.flatten(), minlength=c.n_routed_experts).float()
        lim = c.swiglu_limit
        w1, w3, w2 = (fp4_weight_qdq(w) for w in (lw.w1, lw.w3, lw.w2))
        y = torch.zeros_like(x)
        for e in range(c.n_routed_experts):
            rows, slots = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            xe = x[rows]
            h = swiglu(xe @ w1[e].t(), xe @ w3[e].t(), lim) * weights[rows, slots, None]
            y = y.index_add(0, rows, h @ w2[e].t())
        sh = swiglu(x @ fp8_weight_qdq(lw.sw1).t(), x @ fp8_weight_qdq(lw.sw3).t(), lim)
        y = y + sh @ fp8_weight_qdq(lw.sw2).t()
        return y.view(shape)

    def engram(self, lw: Layer, streams: torch.Tensor, hash_ids: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        B, T = hash_ids.shape[:2]
        d, hc = c.dim, c.hc_mult
        table = fp8_weight_qdq(lw.eng_table, rows_per_scale=1)
        rows = F.embedding(hash_ids, table).flatten(-2)  # [B, T, n_cols * ehd]
        kv = rows @ fp8_weight_qdq(lw.eng_wkv).t()
        key = kv[..., : hc * d].unflatten(-1, (hc, d))
        value = kv[..., hc * d:]
        return engram_gate(streams, key, value, bf16_qdq(lw.eng_qk), c.norm_eps)

    # -----------------------------------------------------------------------------------------

    def forward(self, ids: torch.Tensor, hash_ids: torch.Tensor | None):
        """ids [B, T] from position 0; hash_ids [B, T, n_engram_layers, n_cols]. Returns the
        final hidden states [B, T, dim] (before the head) and the auxiliary index data."""
        c = self.cfg
        B, T = ids.shape
        h = self.embed[self.embed_slot[ids]]
        streams = h.unsqueeze(-2).expand(B, T, self.hc, c.dim)
        pre_mix = torch.zeros(B, T, self.hc)
        pre_mix[..., 0] = 1
        shared: dict = {}
        aux: dict = {}
        for lw in self.layers:
            if lw.engram:
                streams = self.engram(lw, streams, hash_ids[:, :, c.engram_layer_ids.index(lw.L)])
            a_attn, p_attn, c_attn = self.hc_mixes(streams, lw.hc_attn_fn, lw.hc_attn_scale, lw.hc_attn_base)
            x = rms_norm(self.hc_pre(streams, pre_mix), lw.attn_norm, c.norm_eps)
            streams = self.hc_post(self.attention(lw, x, shared, aux), streams, p_attn, c_attn)
            a_ffn, p_ffn, c_ffn = self.hc_mixes(streams, lw.hc_ffn_fn, lw.hc_ffn_scale, lw.hc_ffn_base)
            x = rms_norm(self.hc_pre(streams, a_attn), lw.ffn_norm, c.norm_eps)
            streams = self.hc_post(self.moe(lw, x), streams, p_ffn, c_ffn)
            pre_mix = a_ffn
        final = rms_norm(self.hc_pre(streams, pre_mix), self.norm, c.norm_eps)
        return final, aux

    def head_logits(self, final: torch.Tensor) -> torch.Tensor:
        return final @ bf16_qdq(self.head).t()

    def loss(self, final: torch.Tensor, targets: torch.Tensor):
        """Cross-entropy over the full vocabulary (rows outside the head set have logit 0) and
        top-1 accuracy."""
        logits = self.head_logits(final).flatten(0, 1)  # [N, n_head]
        targets = targets.flatten()
        zero_col = torch.full((logits.shape[0], 1), self.log_zero_rows)
        lse = torch.logsumexp(torch.cat([logits, zero_col], -1), -1)
        slot = self.head_slot[targets]
        tgt = torch.where(slot >= 0, logits.gather(1, slot.clamp_min(0)[:, None])[:, 0], torch.zeros_like(lse))
        ce = (lse - tgt).mean()
        with torch.no_grad():
            best = logits.max(-1)
            pred = torch.where(best.values > 0, self.head_ids[best.indices], torch.full_like(slot, -1))
            acc = (pred == targets).float().mean()
        return ce, acc

    @torch.no_grad()
    def update_router_bias(self, rate: float):
        """noaux_tc balancing: raise the bias of under-loaded experts, lower the over-loaded."""
        for lw in self.layers:
            if lw.load.sum() > 0:
                lw.gate_b += rate * torch.sign(lw.load.mean() - lw.load)
            lw.load.zero_()


@fused
def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    if limit > 0:
        up = up.clamp(-limit, limit)
        gate = gate.clamp(max=limit)
    return F.silu(gate) * up


def index_kl_loss(aux: dict) -> torch.Tensor:
    """KL(attention mass || softmax(index scores)) over visible entries, averaged over the queries
    that see at least one compressed entry, summed over index layers."""
    total = torch.zeros(())
    for (L, score, visible), target in zip(aux.get("index", []), aux.get("index_target", [])):
        has = visible.any(-1)  # [T]
        logp = torch.log_softmax(score[:, has], -1)
        t = target[:, has]
        kl = (t * (torch.log(t.clamp_min(1e-12)) - logp.masked_fill(t == 0, 0.0))).sum(-1)
        total = total + kl.mean()
    return total
