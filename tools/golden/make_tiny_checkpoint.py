#!/usr/bin/env python3
"""Test utility: writes a tiny checkpoint in the released V4.1 HF layout (nested config.json,
sharded safetensors + index, released tensor names / dtypes / block scales, tokenizer files), with
seeded random weights. It exists so the golden harness can be exercised without `cedar make-tiny`;
goldens committed for CI are made from `cedar make-tiny` checkpoints (make_goldens.sh).

Dims follow the `tiny` preset of cedar's make-tiny (dim 64, 4 heads x 64, window 16, index top-k
16, candidate pool 8 x 4, 16 experts top-6) and keep the 40 + 3 layer structure. vocab_size is the
tokenizer's size, so every id the model can emit has an Engram compressed id.

    make_tiny_checkpoint.py --out DIR --seed N [--tokenizer-dir DIR]

The tokenizer folder holds tokenizer.json or tokenizer.json.zst (decompressed with the `zstd` tool)
and optionally tokenizer_config.json; default: the repository's data/tokenizers/deepseek-v4 (as
make-tiny, but without V4.1's two renamed markers, which change neither ids nor Engram classes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engram_hash import build_compressed_token_map, engram_primes  # noqa: E402
from numerics import E2M1_GRID, e2m1_codes  # noqa: E402

DEFAULT_TOKENIZER_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "tokenizers",
                                     "deepseek-v4")


def tiny_text_config(vocab_size: int) -> dict:
    n_layers, n_mtp = 40, 3
    return {
        "model_type": "deepseek_v41_text", "vocab_size": vocab_size, "hidden_size": 64,
        "moe_intermediate_size": 32, "num_hidden_layers": n_layers, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 64, "qk_rope_head_dim": 16, "q_lora_rank": 32,
        "o_lora_rank": 32, "o_groups": 2, "hidden_act": "silu", "swiglu_limit": 10.0, "rms_norm_eps": 1e-20,
        "tie_word_embeddings": False, "max_position_embeddings": 1048576, "rope_theta": 10000,
        "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                         "original_max_position_embeddings": 65536},
        "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 6,
        "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
        "routed_scaling_factor": 1.5, "sliding_window": 16,
        "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0] * n_mtp,
        "compress_rope_theta": 160000, "kv_source_layer_ids": [2, 8, 14, 20],
        "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36], "index_n_heads": 4, "index_head_dim": 32,
        "index_topk": 16, "candidate_source_layer_id": 20, "candidate_topk_blocks": 8, "candidate_block_size": 4,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "engram_layer_ids": [1, 14],
        "engram_max_ngram_size": 4, "engram_vocab_size": 1000, "engram_n_heads": 2, "engram_head_dim": 32,
        "engram_pad_token_id": 2, "num_nextn_predict_layers": n_mtp,
        "dspark_block_size": 5, "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [37, 38, 39],
        "dspark_markov_rank": 16, "dspark_n_routed_experts": 8, "dspark_num_experts_per_tok": 3,
    }


class Gen:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.tensors: dict[str, np.ndarray] = {}

    def normal(self, shape, std):
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def bf16(self, name, shape, std):
        self.tensors[name] = self.normal(shape, std).astype(ml_dtypes.bfloat16)

    def norm(self, name, dim):
        self.tensors[name] = (1 + 0.1 * self.rng.uniform(-1, 1, dim)).astype(np.float32).astype(ml_dtypes.bfloat16)

    def f32(self, name, shape, std, positive=False):
        v = self.normal(shape, std)
        self.tensors[name] = (0.5 + np.abs(v)).astype(np.float32) if positive else v

    def fp8(self, name, n, k, std=None, per_row=False):
        """E4M3 weight with one E8M0 scale per 32x32 tile (or per row per 32 columns: Engram)."""
        v = self.normal((n, k), std if std is not None else 1 / np.sqrt(k))
        self.tensors[name + ".weight"], self.tensors[name + ".scale"] = quantize_fp8(v, per_row)

    def fp4(self, name, n, k):
        v = self.normal((n, k), 1 / np.sqrt(k))
        self.tensors[name + ".weight"], self.tensors[name + ".scale"] = quantize_fp4(v)


def _pow2_exp(amax, qmax):
    """Smallest e with amax / 2^e <= qmax."""
    e = np.ceil(np.log2(np.maximum(amax, 1e-30) / qmax)).astype(np.int32)
    return np.clip(e, -120, 120)


def quantize_fp8(v: np.ndarray, per_row: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [N, K] -> (E4M3 weight, E8M0 scales): one power-of-two scale per 32x32 tile, or per row
    per 32 columns (Engram tables); the scale is the smallest that keeps the tile within 448."""
    n, k = v.shape
    br = 1 if per_row else 32
    nbr, nbc = -(-n // br), -(-k // 32)
    pad = np.zeros((nbr * br, nbc * 32), np.float32)
    pad[:n, :k] = v
    tiles = np.abs(pad.reshape(nbr, br, nbc, 32)).max(axis=(1, 3))
    e = _pow2_exp(tiles, 448.0)
    scale_full = np.repeat(np.repeat(np.exp2(e.astype(np.float32)), br, 0), 32, 1)[:n, :k]
    weight = np.clip(v / scale_full, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn)
    return weight, np.exp2(e.astype(np.float32)).astype(ml_dtypes.float8_e8m0fnu)


def quantize_fp4(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 [N, K] -> (E2M1 packed two per byte, even element in the low nibble; E8M0 scale per row
    per 32 along K)."""
    n, k = v.shape
    g = v.reshape(n, k // 32, 32)
    e = _pow2_exp(np.abs(g).max(-1), float(E2M1_GRID[-1]))
    scaled = np.clip(g / np.exp2(e.astype(np.float32))[..., None], -6, 6).reshape(n, k)
    codes = e2m1_codes(scaled.astype(np.float32))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8).view(np.int8)
    return packed, np.exp2(e.astype(np.float32)).astype(ml_dtypes.float8_e8m0fnu)


def make(out_dir: str, seed: int, tokenizer_dir: str) -> None:
    tok_json = os.path.join(tokenizer_dir, "tokenizer.json")
    if not os.path.exists(tok_json) and os.path.exists(tok_json + ".zst"):
        os.makedirs(out_dir, exist_ok=True)
        unpacked = os.path.join(out_dir, "tokenizer.json")
        with open(unpacked, "wb") as f:
            subprocess.run(["zstd", "-dc", tok_json + ".zst"], stdout=f, check=True)
        tok_json = unpacked
    token_map, n_classes = build_compressed_token_map(tok_json)
    text = tiny_text_config(len(token_map))
    text["engram_compressed_vocab_size"] = n_classes
    primes = engram_primes(len(text["engram_layer_ids"]), text["engram_max_ngram_size"], text["engram_n_heads"],
                           text["engram_vocab_size"])
    text["engram_num_embeddings"] = [sum(p for order in layer for p in order) for layer in primes]
    config = {
        "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "bos_token_id": 0,
        "eos_token_id": 1, "pad_token_id": 2, "image_token_id": 129264, "dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                                "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
        "text_config": text,
    }
    g = Gen(seed)
    d, hd, hc = text["hidden_size"], text["head_dim"], text["hc_mult"]
    inter, heads = text["moe_intermediate_size"], text["num_attention_heads"]
    q_lora, o_lora, groups = text["q_lora_rank"], text["o_lora_rank"], text["o_groups"]
    ih, idim = text["index_n_heads"], text["index_head_dim"]
    g.bf16("embed.weight", (text["vocab_size"], d), 1.0)
    g.bf16("head.weight", (text["vocab_size"], d), 1 / np.sqrt(d))
    g.norm("norm.weight", d)
    mix = (2 + hc) * hc

    def block_core(p):
        """A Block's norms, hyper-connection mixes and attention projections, drawn in this order."""
        g.norm(p + "attn_norm.weight", d)
        g.norm(p + "ffn_norm.weight", d)
        for site in ("attn", "ffn"):
            g.f32(p + f"hc_{site}_fn", (mix, hc * d), 0.5 / np.sqrt(hc * d))
            g.f32(p + f"hc_{site}_base", (mix,), 0.3)
            g.f32(p + f"hc_{site}_scale", (3,), 0.5, positive=True)
        a = p + "attn."
        g.f32(a + "attn_sink", (heads,), 1.0)
        g.fp8(a + "wq_a", q_lora, d)
        g.norm(a + "q_norm.weight", q_lora)
        g.fp8(a + "wq_b", heads * hd, q_lora)
        g.fp8(a + "wkv", hd, d)
        g.norm(a + "kv_norm.weight", hd)
        g.fp8(a + "wo_a", groups * o_lora, heads * hd // groups)
        g.fp8(a + "wo_b", d, groups * o_lora)

    def moe(f, n_experts):
        """A MoE's gate, routed experts and shared expert, drawn in this order."""
        g.bf16(f + "gate.weight", (n_experts, d), 1 / np.sqrt(d))
        g.f32(f + "gate.bias", (n_experts,), 0.05)
        for e in range(n_experts):
            g.fp4(f + f"experts.{e}.w1", inter, d)
            g.fp4(f + f"experts.{e}.w3", inter, d)
            g.fp4(f + f"experts.{e}.w2", d, inter)
        g.fp8(f + "shared_experts.w1", inter, d)
        g.fp8(f + "shared_experts.w3", inter, d)
        g.fp8(f + "shared_experts.w2", d, inter)

    for L in range(text["num_hidden_layers"]):
        p = f"layers.{L}."
        ratio = text["compress_ratios"][L]
        block_core(p)
        a = p + "attn."
        if L in text["kv_source_layer_ids"]:
            g.bf16(a + "compressor.wkv.weight", (hd, d), 1 / np.sqrt(d))
            if ratio > 1:
                g.bf16(a + "compressor.wgate.weight", (hd, d), 1 / np.sqrt(d))
            g.norm(a + "compressor.norm.weight", hd)
            g.bf16(a + "indexer.wk.weight", (idim, hd), 1 / np.sqrt(hd))
            g.norm(a + "indexer.k_norm.weight", idim)
        if L in text["index_source_layer_ids"]:
            g.fp8(a + "indexer.wq_b", ih * idim, q_lora)
            g.bf16(a + "indexer.weights_proj.weight", (ih, d), 1 / np.sqrt(d))
        moe(p + "ffn.", text["n_routed_experts"])
        if L in text["engram_layer_ids"]:
            i = text["engram_layer_ids"].index(L)
            rows, ehd = text["engram_num_embeddings"][i], text["engram_head_dim"]
            n_cols = (text["engram_max_ngram_size"] - 1) * text["engram_n_heads"]
            e = p + "engram."
            g.fp8(e + "embed", rows, ehd, std=1.0, per_row=True)
            g.fp8(e + "wkv", d * (hc + 1), n_cols * ehd)
            g.bf16(e + "q_weight", (hc, d), 0.3)
            g.bf16(e + "k_weight", (hc, d), 0.3)

    # DSpark stages (docs/DSPARK.md) after every backbone tensor, so the backbone's draws do not move
    for S in range(text["num_nextn_predict_layers"]):
        p = f"mtp.{S}."
        block_core(p)  # a stage is a Block with window-only attention
        moe(p + "ffn.", text["dspark_n_routed_experts"])
        if S == 0:
            n_t = len(text["dspark_target_layer_ids"])
            g.fp8(p + "main_proj", d, n_t * d)
            g.norm(p + "main_norm.weight", d)
        if S == text["num_nextn_predict_layers"] - 1:
            r = text["dspark_markov_rank"]
            g.norm(p + "norm.weight", d)
            g.bf16(p + "markov_head.embed.weight", (text["vocab_size"], r), 1 / np.sqrt(r))
            g.bf16(p + "markov_head.head.weight", (text["vocab_size"], r), 1 / np.sqrt(r))
            g.bf16(p + "confidence_head.proj.weight", (1, d + r), 1 / np.sqrt(d + r))

    os.makedirs(out_dir, exist_ok=True)
    names = sorted(g.tensors)
    shards = {0: [n for n in names if not n.startswith("layers.")]}
    for n in names:
        if n.startswith("layers."):
            shards.setdefault(1 + int(n.split(".")[1]) * 3 // text["num_hidden_layers"], []).append(n)
    weight_map, total = {}, 0
    for s, members in sorted(shards.items()):
        fname = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: g.tensors[n] for n in members}, os.path.join(out_dir, fname), metadata={"format": "pt"})
        for n in members:
            weight_map[n] = fname
            total += g.tensors[n].nbytes
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(tokenizer_dir, name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(out_dir, name))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="write a tiny V4.1 checkpoint (test utility)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-dir", default=os.path.normpath(DEFAULT_TOKENIZER_DIR))
    args = ap.parse_args(argv)
    make(args.out, args.seed, args.tokenizer_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
