#!/usr/bin/env python3
"""Independent numpy implementation of the DeepSeek-V4.1 reference forward pass (official
`inference/model.py` + `kernel.py` semantics; spec sections 2, 4 and 9) for golden outputs.

It reads a checkpoint directory in the released HF layout, runs one prefill call over the whole
prompt at start_pos 0 and then one token per call, greedy (temperature 0), exactly like the
reference's generate loop, and writes a small JSON: prompt ids, greedy ids, per-step last-position
logits (top-32, stride samples, moments; the full row for step 0 when the vocab is small),
per-layer stream summaries and each index source's selection for the last position.

    reference_forward.py --checkpoint DIR --prompt-ids 0,5,9,... --max-new-tokens 8 \
        [--index-keys reference|owner] --out golden.json

`--index-keys reference` (default) reproduces the reference's index-key publication quirk (spec
9.1): a ratio-2 KV source publishes its index keys only on calls where it produced a latent, so on
decode steps at even positions layers 2/8/14 score against the slot's previous content (layer 20's
keys). `owner` makes every KV source publish its own keys on every call (the upstream fix).
Ties in any top-k (bf16 index scores, candidate blocks, router, argmax) go to the lower index;
ties that straddle a selection boundary and change the outcome are counted in the output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numerics as nx  # noqa: E402
from checkpoint import CheckpointError, Weights, dequant_fp8_to_bf16, load_config, load_linear  # noqa: E402
from engram_hash import EngramHasher, EngramHashState, build_compressed_token_map  # noqa: E402
from vision_reference import Vision, VisionArgs, make_patches  # noqa: E402

F32 = np.float32
F64 = np.float64
FORMAT = "cedar-golden-v1"


def linear(x: np.ndarray, lin) -> np.ndarray:
    """The reference's `linear()`: dispatch on the stored weight format."""
    if lin.kind == "fp8":
        return nx.linear_fp8(x, lin.weight, lin.scale)
    if lin.kind == "fp4":
        return nx.linear_fp4(x, lin.weight, lin.scale)
    if lin.kind == "bf16":
        return nx.linear_bf16(x, lin.weight)
    return nx.linear_f32(x, lin.weight)


@dataclass
class Ties:
    """Selections whose result depends on the tie rule (lower index first)."""
    index_topk: int = 0
    candidate_blocks: int = 0
    router_topk: int = 0
    argmax: int = 0

    def as_dict(self):
        return dict(self.__dict__)


def boundary_tie(scores: np.ndarray, k: int, matters: np.ndarray | None = None) -> int:
    """Rows of `scores` [R, T] whose k-th and (k+1)-th largest values tie (and, if `matters`
    [R, T] is given, the tied group holds an entry for which being picked changes the result)."""
    if k >= scores.shape[-1] or k == 0:
        return 0
    order, kth = nx.topk_lowest_index(scores, k)
    count = 0
    for r in range(scores.shape[0]):
        group = scores[r] == kth[r]
        if group.sum() > (scores[r][order[r]] == kth[r]).sum():  # the group straddles the cut
            if matters is None or (group & matters[r]).any():
                count += 1
    return count


@dataclass
class SharedSlots:
    """What the reference's SharedAttentionRuntime hands down the stack within and across calls."""
    compress_kv: np.ndarray | None = None  # the most recent KV source's compressed cache
    index_k: np.ndarray | None = None  # the index-key cache last published
    topk_idxs: np.ndarray | None = None  # the most recent index source's selection
    candidates: np.ndarray | None = None  # the candidate source's block mask


@dataclass
class LayerState:
    window: np.ndarray  # [window, head_dim] ring of FP8-QDQ'd window K
    compress_kv: np.ndarray | None = None  # [max_entries, head_dim] (KV sources)
    index_k: np.ndarray | None = None  # [max_entries, index_head_dim] (KV sources)
    kv_state: np.ndarray | None = None  # [ratio, head_dim] fp32 pending group (ratio > 1)
    score_state: np.ndarray | None = None


class ReferenceModel:
    def __init__(self, ckpt_dir: str, index_keys: str = "reference", max_seq_len: int = 4096):
        if index_keys not in ("reference", "owner"):
            raise ValueError(f"--index-keys must be 'reference' or 'owner', got {index_keys!r}")
        self.dir = ckpt_dir
        self.cfg = cfg = load_config(os.path.join(ckpt_dir, "config.json"))
        self.index_keys = index_keys
        self.max_seq_len = max_seq_len
        self.w = Weights(ckpt_dir)
        self.hasher = None
        if cfg.engram_layer_ids:
            tok_path = os.path.join(ckpt_dir, "tokenizer.json")
            if not os.path.exists(tok_path):
                raise CheckpointError(f"{ckpt_dir}: tokenizer.json is missing; Engram hashing needs it")
            token_map, count = build_compressed_token_map(tok_path)
            self.hasher = EngramHasher.from_config(cfg, token_map, count)
        self.inv_freq_swa = nx.rope_inv_freq(cfg.rope_head_dim, cfg.rope_theta, 0, 1.0, 32, 1)
        self.inv_freq_compressed = nx.rope_inv_freq(cfg.rope_head_dim, cfg.compress_rope_theta, cfg.original_seq_len,
                                                    cfg.rope_factor, cfg.beta_fast, cfg.beta_slow)
        # the vision path (vision_n_layers > 0): ViT + Aligner and the span delimiters' embeddings
        self.vision = None
        self.image_token_id = int(cfg.raw.get("image_token_id", 129264))
        if cfg.raw.get("vision_config"):
            self.vision = Vision(self.w, VisionArgs(cfg.raw))
            self.image_vectors = [self.w.array(n, (cfg.dim,), ("BF16",))
                                  for n in ("image_start", "image_newline", "image_end")]
        self._load_weights()
        self.reset()

    # -----------------------------------------------------------------------------------------
    # Weights

    def _norm(self, name: str, dim: int) -> np.ndarray:
        # RMSNorm weights are parameters of the default dtype (bf16) in the reference.
        return nx.bf16(self.w.array(name, (dim,), ("BF16", "F32")))

    def load_block_core(self, p: str) -> dict:
        """A Block's norms, hyper-connection mixes and attention projections (Block.__init__ and
        Attention.__init__), under the prefix `p`; shared by the backbone and the DSpark stages."""
        c, w = self.cfg, self.w
        d, hd, hc = c.dim, c.head_dim, c.hc_mult
        mix = (2 + hc) * hc
        lw = {"attn_norm": self._norm(p + "attn_norm.weight", d), "ffn_norm": self._norm(p + "ffn_norm.weight", d)}
        for site in ("attn", "ffn"):
            lw[f"hc_{site}_fn"] = w.array(p + f"hc_{site}_fn", (mix, hc * d), ("F32",))
            lw[f"hc_{site}_base"] = w.array(p + f"hc_{site}_base", (mix,), ("F32",))
            lw[f"hc_{site}_scale"] = w.array(p + f"hc_{site}_scale", (3,), ("F32",))
        a = p + "attn."
        lw["attn_sink"] = w.array(a + "attn_sink", (c.n_heads,), ("F32",))
        lw["wq_a"] = load_linear(w, a + "wq_a", c.q_lora_rank, d, ("fp8",))
        lw["q_norm"] = self._norm(a + "q_norm.weight", c.q_lora_rank)
        lw["wq_b"] = load_linear(w, a + "wq_b", c.n_heads * hd, c.q_lora_rank, ("fp8",))
        lw["wkv"] = load_linear(w, a + "wkv", hd, d, ("fp8",))
        lw["kv_norm"] = self._norm(a + "kv_norm.weight", hd)
        group_in = c.n_heads * hd // c.o_groups
        wo_a = dequant_fp8_to_bf16(load_linear(w, a + "wo_a", c.o_groups * c.o_lora_rank, group_in, ("fp8", "bf16")))
        lw["wo_a"] = wo_a.reshape(c.o_groups, c.o_lora_rank, group_in)
        lw["wo_b"] = load_linear(w, a + "wo_b", d, c.o_groups * c.o_lora_rank, ("fp8",))
        return lw

    def load_moe(self, f: str, n_experts: int) -> dict:
        """A MoE's gate, routed experts and shared expert (MoE.__init__), under the prefix `f`."""
        c, w = self.cfg, self.w
        d = c.dim
        kinds = ("fp4",) if c.expert_dtype == "fp4" else ("fp8",)
        shapes = (("w1", (c.moe_inter_dim, d)), ("w3", (c.moe_inter_dim, d)), ("w2", (d, c.moe_inter_dim)))
        return {
            "gate_w": nx.bf16(w.array(f + "gate.weight", (n_experts, d), ("BF16", "F32"))),
            "gate_b": w.array(f + "gate.bias", (n_experts,), ("F32",)),
            # Gate.bias_vl exists when the model has a vision tower: image-span rows select with it
            "gate_bv": (w.array(f + "gate.bias_vl", (n_experts,), ("F32",)) if self.vision else None),
            "experts": [{k: load_linear(w, f + f"experts.{e}.{k}", *sh, kinds) for k, sh in shapes}
                        for e in range(n_experts)],
            "shared": {k: load_linear(w, f + f"shared_experts.{k}", *sh, ("fp8",)) for k, sh in shapes},
        }

    def _load_weights(self):
        c, w = self.cfg, self.w
        d, hd, hc = c.dim, c.head_dim, c.hc_mult
        self.embed = w.array("embed.weight", (c.vocab_size, d), ("BF16",))
        # the reference promotes the head to an fp32 parameter (exact copy of the bf16 values)
        self.head = w.array("head.weight", (c.vocab_size, d), ("BF16", "F32")).astype(F32)
        self.norm = self._norm("norm.weight", d)
        self.layers = []
        for L in range(c.n_layers):
            p = f"layers.{L}."
            ratio = c.compress_ratios[L]
            lw = self.load_block_core(p)
            a = p + "attn."
            if L in c.kv_source_layers:
                # ratio > 1: the reference holds wkv / wgate as fp32 (exact copies of bf16 values)
                kinds = ("bf16", "f32")
                lw["cmp_wkv"] = load_linear(w, a + "compressor.wkv", hd, d, kinds)
                if ratio > 1:
                    lw["cmp_wgate"] = load_linear(w, a + "compressor.wgate", hd, d, kinds)
                else:
                    lw["cmp_wkv"].weight = nx.bf16(lw["cmp_wkv"].weight.astype(F32))
                    lw["cmp_wkv"].kind = "bf16"
                lw["cmp_norm"] = self._norm(a + "compressor.norm.weight", hd)
            if L in c.index_source_layers:
                lw["idx_wq_b"] = load_linear(w, a + "indexer.wq_b", c.index_n_heads * c.index_head_dim,
                                             c.q_lora_rank, ("fp8",))
                lw["idx_weights_proj"] = load_linear(w, a + "indexer.weights_proj", c.index_n_heads, d, ("bf16",))
                if L in c.kv_source_layers:
                    lw["idx_wk"] = load_linear(w, a + "indexer.wk", c.index_head_dim, hd, ("bf16",))
                    lw["idx_k_norm"] = self._norm(a + "indexer.k_norm.weight", c.index_head_dim)
            lw.update(self.load_moe(p + "ffn.", c.n_routed_experts))
            if L in c.engram_layer_ids:
                i = c.engram_layer_ids.index(L)
                rows, ehd = c.engram_num_embeddings[i], c.engram_head_dim
                n_cols = (c.engram_max_ngram_size - 1) * c.engram_n_heads
                e = p + "engram."
                lw["eng_table"] = w.array(e + "embed.weight", (rows, ehd), ("F8_E4M3",))
                lw["eng_scale"] = w.array(e + "embed.scale", (rows, ehd // 32), ("F8_E8M0",))
                lw["eng_wkv"] = load_linear(w, e + "wkv", d * (hc + 1), n_cols * ehd, ("fp8",))
                lw["eng_qk"] = (nx.bf16(w.array(e + "q_weight", (hc, d), ("BF16", "F32")))
                                * nx.bf16(w.array(e + "k_weight", (hc, d), ("BF16", "F32")))).astype(F32)
            self.layers.append(lw)

    # -----------------------------------------------------------------------------------------
    # State

    def reset(self):
        c = self.cfg
        self.shared = SharedSlots()
        self.state = []
        for L in range(c.n_layers):
            st = LayerState(window=np.zeros((c.window_size, c.head_dim), F32))
            ratio = c.compress_ratios[L]
            if L in c.kv_source_layers:
                st.compress_kv = np.zeros((self.max_seq_len // ratio, c.head_dim), F32)
                st.index_k = np.zeros((self.max_seq_len // ratio, c.index_head_dim), F32)
                if ratio > 1:
                    st.kv_state = np.zeros((ratio, c.head_dim), F32)
                    st.score_state = np.full((ratio, c.head_dim), -np.inf, F32)
            self.state.append(st)
        self.engram_state = EngramHashState(self.hasher) if self.hasher else None
        self.ties = Ties()

    def rope(self, L: int, positions) -> tuple[np.ndarray, np.ndarray]:
        inv = self.inv_freq_compressed if self.cfg.compress_ratios[L] else self.inv_freq_swa
        return nx.rope_cos_sin(np.asarray(positions), inv)

    # -----------------------------------------------------------------------------------------
    # Attention

    def _window(self, L: int, kv: np.ndarray, p0: int) -> tuple[np.ndarray, np.ndarray]:
        """Window operand and indices; seeds / updates the ring (slot = position mod window)."""
        win, st, s_len = self.cfg.window_size, self.state[L], kv.shape[0]
        if p0 == 0:
            for pos in range(max(0, s_len - win), s_len):
                st.window[pos % win] = kv[pos]
            end = np.arange(s_len)[:, None]
            idx = np.maximum(end - win + 1, 0) + np.arange(min(s_len, win))[None, :]
            idx = np.where(idx > end, -1, idx)
            return kv, idx
        st.window[p0 % win] = kv[0]
        oldest = p0 % win + 1
        idx = np.concatenate([np.arange(oldest, win), np.arange(oldest)])
        idx = np.where(idx > p0, -1, idx)
        return st.window, idx[None, :]

    def _compressor(self, L: int, x: np.ndarray, p0: int) -> np.ndarray | None:
        """Pre-RoPE compressed latents completed by this call, or None."""
        lw, st, ratio = self.layers[L], self.state[L], self.cfg.compress_ratios[L]
        eps = self.cfg.norm_eps
        if ratio == 1:
            return nx.rms_norm(linear(x, lw["cmp_wkv"]), lw["cmp_norm"], eps)
        kv = nx.linear_f32(x, lw["cmp_wkv"].weight)  # [S, head_dim] fp32
        score = nx.linear_f32(x, lw["cmp_wgate"].weight)
        s_len = x.shape[0]
        if p0 == 0:
            rem = s_len % ratio
            cut = s_len - rem
            st.kv_state[:rem] = kv[cut:]
            st.score_state[:rem] = score[cut:]
            if s_len < ratio:
                return None
            groups_kv = kv[:cut].reshape(-1, ratio, kv.shape[1])
            groups_score = score[:cut].reshape(-1, ratio, kv.shape[1])
        else:
            slot = p0 % ratio
            st.kv_state[slot] = kv[0]
            st.score_state[slot] = score[0]
            if (p0 + 1) % ratio:
                return None
            groups_kv, groups_score = st.kv_state[None], st.score_state[None]
        e = nx.exp32(groups_score - groups_score.max(axis=1, keepdims=True))  # softmax over the group
        prob = (e / nx.sum_seq(e, 1)).astype(F32)
        prod = (groups_kv * prob).astype(F32)
        pooled = nx.sum_seq(prod, 1)[:, 0]  # [n_groups, head_dim]
        return nx.rms_norm(nx.bf16(pooled), lw["cmp_norm"], eps)

    def _indexer(self, L: int, x, qr, latent, p0: int, offset: int) -> np.ndarray:
        c, lw, st, sh = self.cfg, self.layers[L], self.state[L], self.shared
        ratio, s_len = c.compress_ratios[L], x.shape[0]
        end = p0 + s_len
        owns_k = L in c.kv_source_layers
        if owns_k and latent is not None:
            positions = np.arange(0, s_len - s_len % ratio, ratio) if p0 == 0 else [p0 + 1 - ratio]
            k = nx.rms_norm(linear(latent, lw["idx_wk"]), lw["idx_k_norm"], c.norm_eps)
            k = nx.fp4_qdq_e8m0(nx.apply_rope(k, *self.rope(L, positions)), 32)
            st.index_k[p0 // ratio : p0 // ratio + k.shape[0]] = k
            sh.index_k = st.index_k
        elif owns_k and self.index_keys == "owner":
            sh.index_k = st.index_k  # the fix: a source always scores against its own keys
        q = linear(qr, lw["idx_wq_b"]).reshape(s_len, c.index_n_heads, c.index_head_dim)
        q = nx.fp4_qdq_e8m0(nx.apply_rope(q, *self.rope(L, range(p0, end))), 32)
        keys = sh.index_k[: end // ratio]  # [T, index_head_dim]
        w_heads = linear(x, lw["idx_weights_proj"])  # [S, n_index_heads] bf16
        w_heads = nx.bf16(w_heads * F32(c.index_head_dim ** -0.5 * c.index_n_heads ** -0.5))
        dots = nx.bf16(nx.f32(np.einsum("shd,td->sht", q.astype(F64), keys.astype(F64))))  # [S, H, T]
        prod = nx.bf16(np.maximum(dots, F32(0)) * w_heads[:, :, None])
        score = nx.bf16(nx.f32(prod.astype(F64).sum(axis=1)))  # [S, T]
        if p0 == 0:
            compress_lens = np.arange(1, s_len + 1) // ratio  # [S]
        else:
            compress_lens = np.full(1, end // ratio)
        visible = np.arange(score.shape[1])[None, :] < compress_lens[:, None]
        if p0 == 0:
            score = np.where(visible, score, F32(-np.inf)).astype(F32)
        if L == c.candidate_source_layer:
            sh.candidates = self._candidate_blocks(score, compress_lens)
        elif 0 <= c.candidate_source_layer < L:
            score = np.where(sh.candidates, score, F32(-np.inf)).astype(F32)
        k_top = min(c.index_topk, end // ratio)
        self.ties.index_topk += boundary_tie(score, k_top, visible)
        sel = np.sort(nx.topk_lowest_index(score, k_top)[0], axis=-1)
        return np.where(sel < compress_lens[:, None], sel + offset, -1)

    def _candidate_blocks(self, score: np.ndarray, compress_lens: np.ndarray) -> np.ndarray:
        c = self.cfg
        bs, width = c.candidate_block_size, score.shape[1]
        padded = np.concatenate([score, np.full((score.shape[0], -width % bs), -np.inf, F32)], axis=1)
        blocks = padded.reshape(score.shape[0], -1, bs).max(-1)  # [S, n_blocks]
        n_blocks = blocks.shape[1]
        last = (compress_lens - 1) // bs  # block of the newest visible entry (-1: none)
        blocks = np.where(np.arange(n_blocks)[None, :] == last[:, None], F32(np.inf), blocks).astype(F32)
        k_top = min(c.candidate_topk_blocks, n_blocks)
        self.ties.candidate_blocks += boundary_tie(blocks, k_top, np.isfinite(blocks))
        order, _ = nx.topk_lowest_index(blocks, k_top)
        keep = np.zeros_like(blocks, dtype=bool)
        np.put_along_axis(keep, order, np.take_along_axis(blocks, order, axis=1) > -np.inf, axis=1)
        return np.repeat(keep, bs, axis=1)[:, :width]

    def attention(self, L: int, x: np.ndarray, p0: int, trace: dict) -> np.ndarray:
        c, lw, st, sh = self.cfg, self.layers[L], self.state[L], self.shared
        s_len, ratio, eps = x.shape[0], c.compress_ratios[L], c.norm_eps
        cos, sin = self.rope(L, range(p0, p0 + s_len))
        qr = nx.rms_norm(linear(x, lw["wq_a"]), lw["q_norm"], eps)  # [S, q_lora]
        q = linear(qr, lw["wq_b"]).reshape(s_len, c.n_heads, c.head_dim)  # [S, H, head_dim]
        q = nx.apply_rope(q, cos, sin)
        kv = nx.rms_norm(linear(x, lw["wkv"]), lw["kv_norm"], eps)  # [S, head_dim]
        kv = nx.fp8_qdq(nx.apply_rope(kv, cos, sin))
        operand, idx = self._window(L, kv, p0)
        if ratio:
            offset = operand.shape[0]
            compress_len = (p0 + s_len) // ratio
            latent = None
            if L in c.kv_source_layers:
                latent = self._compressor(L, x, p0)
                sh.compress_kv = st.compress_kv
            if L in c.index_source_layers:
                if compress_len == 0:
                    sh.topk_idxs = np.zeros((s_len, 0), dtype=np.int64)
                else:
                    sh.topk_idxs = self._indexer(L, x, qr, latent, p0, offset)
                last = sh.topk_idxs[-1]
                trace.setdefault("selected", {})[str(L)] = [int(i - offset) for i in last if i >= 0]
            if latent is not None:
                positions = np.arange(0, s_len - s_len % ratio, ratio) if p0 == 0 else [p0 + 1 - ratio]
                rotated = nx.apply_rope(latent, *self.rope(L, positions))
                st.compress_kv[p0 // ratio : p0 // ratio + latent.shape[0]] = nx.fp4_qdq_e4m3(rotated, 16)
            operand = np.concatenate([operand, sh.compress_kv[:compress_len]], axis=0)
            idx = np.concatenate([idx, sh.topk_idxs], axis=1)
        o = nx.sparse_attn(q, operand, lw["attn_sink"], idx, c.head_dim ** -0.5)  # [S, H, head_dim]
        o = nx.apply_rope(o, cos, sin, inverse=True)
        o = o.reshape(s_len, c.o_groups, -1)  # [S, G, H/G * head_dim]
        t = nx.bf16(nx.f32(np.einsum("sgd,grd->sgr", o.astype(F64), lw["wo_a"].astype(F64))))  # [S, G, o_lora]
        return linear(t.reshape(s_len, -1), lw["wo_b"])

    # -----------------------------------------------------------------------------------------
    # MoE, Engram, blocks

    def _expert(self, ex: dict, x: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
        gate = linear(x, ex["w1"])
        up = linear(x, ex["w3"])
        lim = self.cfg.swiglu_limit
        if lim > 0:
            up = np.clip(up, F32(-lim), F32(lim))
            gate = np.minimum(gate, F32(lim))
        h = (nx.silu(gate) * up).astype(F32)
        if weights is not None:
            h = (weights[:, None] * h).astype(F32)
        return linear(nx.bf16(h), ex["w2"])

    def moe(self, L: int, x: np.ndarray, image_mask: np.ndarray | None = None) -> np.ndarray:
        y, ties = self.moe_of(self.layers[L], x, self.cfg.n_routed_experts, self.cfg.n_activated_experts, image_mask)
        self.ties.router_topk += ties
        return y

    def moe_of(self, lw: dict, x: np.ndarray, n_experts: int, k: int,
               image_mask: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """MoE.forward with Gate.forward (score function, bias for selection only, top-k, weights from
        the unbiased scores), for the weights `lw` (load_moe); also the router's top-k boundary ties."""
        c = self.cfg
        logits = (nx.linear_f32(x, lw["gate_w"]) / F32(c.gate_temp)).astype(F32)  # [S, E]
        if c.score_func == "softmax":
            e = nx.exp32(logits - logits.max(-1, keepdims=True))
            scores = (e / nx.f32(e.astype(F64).sum(-1, keepdims=True))).astype(F32)
        elif c.score_func == "sigmoid":
            scores = nx.sigmoid(logits)
        else:
            scores = np.sqrt(nx.softplus(logits)).astype(F32)
        bias = lw["gate_b"][None, :]
        if image_mask is not None and lw.get("gate_bv") is not None:  # torch.where(image_mask, bias_vl, bias)
            bias = np.where(image_mask[:, None], lw["gate_bv"][None, :], bias)
        biased = (scores + bias).astype(F32)
        ties = boundary_tie(biased, k)
        chosen, _ = nx.topk_lowest_index(biased, k)  # [S, k], descending biased score
        weights = np.take_along_axis(scores, chosen, axis=1)
        if c.norm_topk_prob and k > 1:
            weights = (weights / (nx.f32(weights.astype(F64).sum(-1, keepdims=True)) + F32(1e-20))).astype(F32)
        weights = (weights * F32(c.route_scale)).astype(F32)
        y = np.zeros(x.shape, F32)
        for e in range(n_experts):
            rows, slots = np.nonzero(chosen == e)
            if rows.size:
                y[rows] = (y[rows] + self._expert(lw["experts"][e], x[rows], weights[rows, slots])).astype(F32)
        y = (y + self._expert(lw["shared"], x, None)).astype(F32)
        return nx.bf16(y), ties

    def engram(self, L: int, streams: np.ndarray, hash_ids: np.ndarray,
               token_mask: np.ndarray | None = None) -> np.ndarray:
        c, lw = self.cfg, self.layers[L]
        hc, d = c.hc_mult, c.dim
        table = lw["eng_table"][hash_ids]  # [S, n_cols, head_dim] E4M3 values
        scale = np.repeat(lw["eng_scale"][hash_ids], 32, axis=-1)
        rows = nx.bf16((table * scale).astype(F32)).reshape(hash_ids.shape[0], -1)  # [S, n_cols*head_dim]
        kv = linear(rows, lw["eng_wkv"])  # [S, (hc+1)*dim] bf16
        key = kv[:, : hc * d].reshape(-1, hc, d)
        value = kv[:, hc * d :]
        eps = F32(c.norm_eps)
        rstd = (nx.rsqrt(nx.mean_sq(streams) + eps) * nx.rsqrt(nx.mean_sq(key) + eps)).astype(F32)  # [S, hc]
        prod = ((streams * lw["eng_qk"][None]).astype(F32) * key).astype(F32)
        dot = (nx.f32(prod.astype(F64).sum(-1)) * rstd * F32(d ** -0.5)).astype(F32)
        signed = np.copysign(np.sqrt(np.maximum(np.abs(dot), F32(1e-6))), dot).astype(F32)
        gate = nx.sigmoid(signed)  # [S, hc]
        if token_mask is not None:  # gate.masked_fill(~token_mask, 0): image positions pass through
            gate = np.where(token_mask[:, None], gate, F32(0)).astype(F32)
        return nx.bf16((streams + gate[..., None] * value[:, None, :]).astype(F32))

    def block(self, L: int, streams: np.ndarray, p0: int, pre_mix: np.ndarray, trace: dict,
              image_mask: np.ndarray | None = None):
        return self.block_of(self.layers[L], streams, pre_mix, lambda x: self.attention(L, x, p0, trace),
                             lambda x: self.moe(L, x, image_mask))

    def block_of(self, lw: dict, streams: np.ndarray, pre_mix: np.ndarray, attention, moe):
        """Block.forward: single-pass mHC around `attention` and `moe` (x -> output callables), for the
        block weights `lw`; the attention reads the previous FFN's pre-mix. Returns the streams and
        this block's FFN pre-mix."""
        c = self.cfg
        hc_args = (c.norm_eps, c.hc_mult, c.hc_sinkhorn_iters, c.hc_eps)
        residual = streams
        a_attn, p_attn, c_attn = nx.hc_mixes(streams, lw["hc_attn_fn"], lw["hc_attn_scale"], lw["hc_attn_base"],
                                             *hc_args)
        x = nx.rms_norm(nx.hc_pre(streams, pre_mix), lw["attn_norm"], c.norm_eps)
        streams = nx.hc_post(attention(x), residual, p_attn, c_attn)
        residual = streams
        a_ffn, p_ffn, c_ffn = nx.hc_mixes(streams, lw["hc_ffn_fn"], lw["hc_ffn_scale"], lw["hc_ffn_base"], *hc_args)
        x = nx.rms_norm(nx.hc_pre(streams, a_attn), lw["ffn_norm"], c.norm_eps)
        streams = nx.hc_post(moe(x), residual, p_ffn, c_ffn)
        return streams, a_ffn

    def merge_image_embeddings(self, images: list[dict], h: np.ndarray) -> None:
        """Transformer.merge_image_embeddings: each span's delimiters take the learned vectors, its
        IMAGE slots the aligner's rows in reading order (the ViT + Aligner of vision_reference.py)."""
        for img in images:
            types = np.asarray(img["types"])
            span = h[img["start"]: img["start"] + types.size]
            start, newline, end = self.image_vectors
            span[types == 0], span[types == 2], span[types == 3] = start, newline, end
            x = self.vision.vit(img["patches"], img["n_h"], img["n_w"], lambda *_: None)
            span[types == 1] = self.vision.aligner(x, img["n_h"], img["n_w"])

    def forward(self, ids: list[int], p0: int, images: list[dict] | None = None,
                token_types: list[int] | None = None) -> tuple[np.ndarray, dict]:
        """One reference forward call; returns the last position's fp32 logits and a trace.
        images / token_types: prepare_vl_inputs' output (spans only in the call at start_pos 0)."""
        c = self.cfg
        if p0 != 0 and len(ids) != 1:
            raise ValueError("the reference runs multi-token calls only at start_pos 0")
        if p0 + len(ids) > self.max_seq_len:
            raise ValueError(f"sequence exceeds max_seq_len {self.max_seq_len}")
        for t in ids:
            if not 0 <= t < c.vocab_size:
                raise ValueError(f"token id {t} is outside the vocabulary (vocab_size {c.vocab_size})")
        trace: dict = {"layers": []}
        image_mask = None if token_types is None else np.asarray(token_types) >= 0  # TEXT is -1
        engram_mask = None if image_mask is None else ~image_mask
        hashes = self.engram_state(ids, p0, None if engram_mask is None else list(engram_mask)) \
            if self.engram_state else None
        h = self.embed[np.asarray(ids)].copy()  # [S, dim] bf16
        if images:
            if p0 != 0:
                raise ValueError("image spans must be prefilled in a single chunk (start_pos 0)")
            self.merge_image_embeddings(images, h)
        streams = np.repeat(h[:, None, :], c.hc_mult, axis=1)  # [S, hc, dim]
        pre_mix = np.zeros((len(ids), c.hc_mult), F32)
        pre_mix[:, 0] = 1
        main_hiddens = []
        for L in range(c.n_layers):
            if L in c.engram_layer_ids:
                streams = self.engram(L, streams, hashes[:, c.engram_layer_ids.index(L)], engram_mask)
            if L in c.dspark_target_layer_ids:  # the DSpark hook: the target layer's attention input
                main_hiddens.append(stream_mean(streams))
            streams, pre_mix = self.block(L, streams, p0, pre_mix, trace, image_mask)
            trace["layers"].append(stream_summary(streams[-1]))
        final = nx.rms_norm(nx.hc_pre(streams[-1:], pre_mix[-1:]), self.norm, c.norm_eps)  # [1, dim]
        logits = nx.linear_f32(final, self.head)[0]  # [vocab] fp32
        # Transformer.forward's third output, for forward_spec (reference_dspark.py): [S, n_targets * dim]
        self.main_hidden = np.concatenate(main_hiddens, axis=-1) if main_hiddens else None
        return logits, trace

    def generate(self, prompt: list[int], max_new_tokens: int, images: list[dict] | None = None,
                 token_types: list[int] | None = None) -> dict:
        """The reference generate loop at temperature 0 for one sequence. Stops at EOS, or after a
        token the Engram map cannot take (vocab_size larger than the tokenizer): the reference's
        next call would fail on it."""
        self.reset()
        steps, out_ids, pos, ids = [], [], 0, list(prompt)
        stop_reason = "length"
        for _ in range(max_new_tokens):
            logits, trace = self.forward(ids, pos, images, token_types) if pos == 0 else self.forward(ids, pos)
            nxt = int(np.argmax(logits))
            self.ties.argmax += int((logits == logits[nxt]).sum() > 1)
            steps.append({"start_pos": pos, "n_tokens": len(ids), "next_id": nxt, "logits": logits, "trace": trace})
            out_ids.append(nxt)
            pos += len(ids)
            ids = [nxt]
            if nxt == self.cfg.eos_token_id:
                stop_reason = "eos"
                break
            if self.hasher is not None and nxt >= len(self.hasher.token_map):
                stop_reason = "token_outside_tokenizer"
                break
        return {"greedy_ids": out_ids, "stop_reason": stop_reason, "steps": steps, "ties": self.ties.as_dict()}


def stream_mean(streams: np.ndarray) -> np.ndarray:
    """h.mean(dim=2) of the bf16 streams [S, hc, dim]: fp32 sum left to right, times 1/hc, bf16."""
    acc = streams[:, 0].astype(F32)
    for j in range(1, streams.shape[1]):
        acc = (acc + streams[:, j]).astype(F32)
    return nx.bf16((acc * F32(1.0 / streams.shape[1])).astype(F32))


def j32(v) -> float:
    """A float32 value as the shortest decimal that reads back to the same float32."""
    return float(str(np.float32(v)))


def j64(v) -> float:
    """A float64 statistic, 10 significant digits."""
    return float(f"{float(v):.10g}")


def stream_summary(last: np.ndarray) -> dict:
    """[hc, dim] streams of the last position -> mean / abs-mean / first 8 values per stream."""
    x = last.astype(F64)
    return {"mean": [j64(v) for v in x.mean(-1)], "abs_mean": [j64(v) for v in np.abs(x).mean(-1)],
            "first8": [[j32(v) for v in row[:8]] for row in last]}


def logits_summary(logits: np.ndarray, full_max_vocab: int, include_full: bool) -> dict:
    """Top-32 (id, value) in descending order (ties: lower id first), every `stride`-th value,
    and moments of the whole row; the full row when the vocabulary is small."""
    x = logits.astype(F64)
    order, _ = nx.topk_lowest_index(logits[None], min(32, logits.size))
    stride = max(1, logits.size // 64)
    out = {
        "top": [[int(i), j32(logits[i])] for i in order[0]],
        "stride": stride,
        "strided": [j32(v) for v in logits[::stride]],
        "sum": j64(x.sum()), "sum_abs": j64(np.abs(x).sum()), "sum_sq": j64((x * x).sum()),
        "min": j32(logits.min()), "max": j32(logits.max()),
    }
    if include_full and logits.size <= full_max_vocab:
        out["full"] = [j32(v) for v in logits]
    return out


def config_digest(model: ReferenceModel) -> dict:
    c = model.cfg
    with open(os.path.join(model.dir, "config.json"), "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    keys = ["vocab_size", "dim", "n_layers", "n_heads", "head_dim", "rope_head_dim", "q_lora_rank", "o_groups",
            "o_lora_rank", "moe_inter_dim", "n_routed_experts", "n_activated_experts", "window_size", "index_n_heads",
            "index_head_dim", "index_topk", "candidate_source_layer", "candidate_topk_blocks", "candidate_block_size",
            "hc_mult", "engram_layer_ids", "engram_num_embeddings", "engram_compressed_vocab_size"]
    return {"config_sha256": sha, **{k: getattr(c, k) for k in keys}}


def run(args) -> dict:
    import ml_dtypes
    import tokenizers

    model = ReferenceModel(args.checkpoint, args.index_keys, args.max_seq_len)
    if args.prompt_ids is not None:
        prompt = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
    else:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(os.path.join(args.checkpoint, "tokenizer.json"))
        prompt = ([args.bos_id] if args.bos_id >= 0 else []) + tok.encode(args.prompt_text, add_special_tokens=False).ids
        if args.prompt_len:
            if len(prompt) < args.prompt_len:
                raise ValueError(f"--prompt-text gives {len(prompt)} tokens, fewer than --prompt-len {args.prompt_len}")
            prompt = prompt[: args.prompt_len]
    if not prompt:
        raise ValueError("the prompt is empty")
    placeholder_prompt, images, token_types, image_record = prompt, None, None, []
    if args.image_grid:
        prompt, token_types, images = prepare_vl_inputs(model, prompt, args.image_grid)
        image_record = [{"n_vit_h": im["n_h"], "n_vit_w": im["n_w"], "salt": im["salt"], "start": im["start"],
                         "n_tokens": len(im["types"])} for im in images]
    result = model.generate(prompt, args.max_new_tokens, images, token_types)
    steps = []
    for i, s in enumerate(result["steps"]):
        entry = {"start_pos": s["start_pos"], "n_tokens": s["n_tokens"], "next_id": s["next_id"],
                 "logits": logits_summary(s["logits"], args.full_logits_max_vocab, i == 0),
                 "selected": s["trace"].get("selected", {})}
        if i == 0 or i == len(result["steps"]) - 1:
            entry["layers"] = s["trace"]["layers"]
        steps.append(entry)
    return {
        "format": FORMAT,
        "generator": {"script": "tools/golden/reference_forward.py", "numpy": np.__version__,
                      "ml_dtypes": ml_dtypes.__version__, "tokenizers": tokenizers.__version__},
        "checkpoint": {"name": os.path.basename(os.path.normpath(args.checkpoint)), "weights_sha256": model.w.digest(),
                       **config_digest(model)},
        "index_keys": args.index_keys,
        "tie_rule": "lower index first",
        "prompt_text": args.prompt_text,
        "prompt_ids": prompt,
        **({"placeholder_prompt_ids": placeholder_prompt, "images": image_record,
            "pixel_byte": "(row*37 + col*11 + channel*101 + (row*col)%7 + n_w*5 + salt*13) % 256"}
           if image_record else {}),
        "max_new_tokens": args.max_new_tokens,
        "greedy_ids": result["greedy_ids"],
        "stop_reason": result["stop_reason"],
        "ties": result["ties"],
        "steps": steps,
    }


def prepare_vl_inputs(model: ReferenceModel, prompt: list[int], grids: list[str]):
    """image_processor.prepare_vl_inputs on patch grids instead of files: each image_token_id in the
    prompt takes the next grid "n_h,n_w,salt" (vision_reference.make_patches' pixel pattern) and
    expands to image_token_types(ceil(n_h / r), ceil(n_w / r)), every position carrying the id."""
    if model.vision is None:
        raise ValueError("the checkpoint has no vision tower (no vision_config) but --image-grid was given")
    a = model.vision.a
    n_placeholders = sum(t == model.image_token_id for t in prompt)
    if n_placeholders != len(grids):
        raise ValueError(f"Found {n_placeholders} image tokens but got {len(grids)} images")
    tokens, types, images, next_grid = [], [], [], iter(grids)
    for t in prompt:
        if t != model.image_token_id:
            tokens.append(t)
            types.append(-1)
            continue
        n_h, n_w, salt = (int(v) for v in next(next_grid).split(","))
        g_h, g_w = -(-n_h // a.downsample), -(-n_w // a.downsample)
        span = [0] + ([1] * g_w + [2]) * g_h + [3]
        images.append({"start": len(tokens), "types": span, "n_h": n_h, "n_w": n_w, "salt": salt,
                       "patches": make_patches(n_h, n_w, a.patch, salt)})
        tokens += [model.image_token_id] * len(span)
        types += span
    return tokens, types, images


def write_report(text: str, path: str | None) -> None:
    """A script's JSON report: to `path` with a final newline, or to standard output."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    else:
        print(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="checkpoint directory (HF layout)")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt-ids", help="comma-separated token ids")
    g.add_argument("--prompt-text", help="text, tokenized with the checkpoint's tokenizer.json")
    ap.add_argument("--bos-id", type=int, default=0, help="id prepended to --prompt-text (-1: none)")
    ap.add_argument("--prompt-len", type=int, default=0, help="keep the first N ids of --prompt-text's encoding")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--index-keys", choices=("reference", "owner"), default="reference")
    ap.add_argument("--max-seq-len", type=int, default=4096, help="the reference's cache size (ModelArgs default)")
    ap.add_argument("--full-logits-max-vocab", type=int, default=4096)
    ap.add_argument("--image-grid", action="append", default=[],
                    help="n_h,n_w,salt: a patch grid for the next image placeholder of the prompt (repeatable)")
    ap.add_argument("--out", help="output JSON (default: stdout)")
    args = ap.parse_args(argv)
    try:
        out = run(args)
    except (CheckpointError, ValueError) as e:
        print(f"reference_forward: {e}", file=sys.stderr)
        return 1
    write_report("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
                                       for k, v in out.items()) + "\n}", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
