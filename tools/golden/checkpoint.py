"""Reads a checkpoint directory in the released Hugging Face layout: config.json (nested V4.1 form
with `text_config` and `quantization_config`, or the flat form), model.safetensors.index.json plus
shards (parsed by the `safetensors` package, dtypes mapped through ml_dtypes), tokenizer.json.

Config fields are exposed under the reference's ModelArgs names (inference/model.py), so the
forward pass reads like the reference; the HF key each one comes from is in `_FIELDS`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
from safetensors import deserialize


class CheckpointError(ValueError):
    pass


# (ModelArgs name, HF key(s) in text_config, default or REQUIRED)
REQUIRED = object()
_FIELDS = [
    ("vocab_size", ("vocab_size",), REQUIRED),
    ("dim", ("hidden_size",), REQUIRED),
    ("moe_inter_dim", ("moe_intermediate_size",), REQUIRED),
    ("n_layers", ("num_hidden_layers",), REQUIRED),
    ("n_mtp_layers", ("num_nextn_predict_layers",), 0),
    ("n_heads", ("num_attention_heads",), REQUIRED),
    ("n_routed_experts", ("n_routed_experts",), REQUIRED),
    ("n_shared_experts", ("n_shared_experts",), 1),
    ("n_activated_experts", ("num_experts_per_tok",), REQUIRED),
    ("score_func", ("scoring_func",), "sqrtsoftplus"),
    ("route_scale", ("routed_scaling_factor",), 1.0),
    ("swiglu_limit", ("swiglu_limit",), 0.0),
    ("norm_topk_prob", ("norm_topk_prob",), True),
    ("gate_temp", ("gate_temp",), 1.0),
    ("q_lora_rank", ("q_lora_rank",), REQUIRED),
    ("head_dim", ("head_dim",), REQUIRED),
    ("rope_head_dim", ("qk_rope_head_dim",), REQUIRED),
    ("norm_eps", ("rms_norm_eps",), REQUIRED),
    ("o_groups", ("o_groups",), REQUIRED),
    ("o_lora_rank", ("o_lora_rank",), REQUIRED),
    ("window_size", ("sliding_window",), REQUIRED),
    ("compress_ratios", ("compress_ratios",), REQUIRED),
    ("kv_source_layers", ("kv_source_layer_ids",), REQUIRED),
    ("index_source_layers", ("index_source_layer_ids",), REQUIRED),
    ("compress_rope_theta", ("compress_rope_theta",), 160000.0),
    ("rope_theta", ("rope_theta",), 10000.0),
    ("index_n_heads", ("index_n_heads",), 0),
    ("index_head_dim", ("index_head_dim",), 0),
    ("index_topk", ("index_topk",), 0),
    ("candidate_source_layer", ("candidate_source_layer_id",), -1),
    ("candidate_topk_blocks", ("candidate_topk_blocks",), 0),
    ("candidate_block_size", ("candidate_block_size",), 0),
    ("hc_mult", ("hc_mult",), REQUIRED),
    ("hc_sinkhorn_iters", ("hc_sinkhorn_iters",), REQUIRED),
    ("hc_eps", ("hc_eps",), REQUIRED),
    ("engram_layer_ids", ("engram_layer_ids",), []),
    ("engram_num_embeddings", ("engram_num_embeddings",), []),
    ("engram_max_ngram_size", ("engram_max_ngram_size",), 1),
    ("engram_vocab_size", ("engram_vocab_size",), 0),
    ("engram_n_heads", ("engram_n_heads",), 0),
    ("engram_head_dim", ("engram_head_dim",), 0),
    ("engram_pad_id", ("engram_pad_token_id", "engram_pad_id"), 2),
    ("engram_compressed_vocab_size", ("engram_compressed_vocab_size",), 0),
    # DSpark draft stages (ModelArgs.dspark_*; docs/DSPARK.md)
    ("dspark_block_size", ("dspark_block_size",), 0),
    ("dspark_noise_token_id", ("dspark_noise_token_id",), 0),
    ("dspark_target_layer_ids", ("dspark_target_layer_ids",), []),
    ("dspark_markov_rank", ("dspark_markov_rank",), 256),
    ("dspark_n_routed_experts", ("dspark_n_routed_experts",), 0),
    ("dspark_n_activated_experts", ("dspark_num_experts_per_tok", "dspark_n_activated_experts"), 0),
]


@dataclass
class Config:
    raw: dict = field(repr=False, default_factory=dict)
    # rope_scaling (YaRN); original_seq_len 0 = none
    original_seq_len: int = 0
    rope_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    eos_token_id: int = 1
    weight_block_size: int = 32
    expert_dtype: str = "fp4"

    def __getattr__(self, name):  # fields from _FIELDS live in __dict__; this only fires on a typo
        raise AttributeError(f"Config has no field {name!r}")


def load_config(path: str) -> Config:
    try:
        with open(path, encoding="utf-8") as f:
            root = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read config.json ({e})") from e
    text = root.get("text_config", root)
    if not isinstance(text, dict):
        raise CheckpointError(f"{path}: 'text_config' must be an object")
    where = f"{path}: " + ("text_config." if "text_config" in root else "")
    cfg = Config(raw=root)
    for name, keys, default in _FIELDS:
        key = next((k for k in keys if k in text), None)
        if key is None:
            if default is REQUIRED:
                raise CheckpointError(f"{where}{keys[0]} is missing (required by the V4.1 forward pass)")
            value = default
        else:
            value = text[key]
        cfg.__dict__[name] = value
    rs = text.get("rope_scaling")
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        if kind != "yarn":
            raise CheckpointError(f"{where}rope_scaling.rope_type is {kind!r}; only 'yarn' exists in V4.1")
        cfg.original_seq_len = int(rs["original_max_position_embeddings"])
        cfg.rope_factor = float(rs["factor"])
        cfg.beta_fast = float(rs.get("beta_fast", 32))
        cfg.beta_slow = float(rs.get("beta_slow", 1))
    cfg.eos_token_id = int(root.get("eos_token_id", text.get("eos_token_id", 1)))
    quant = root.get("quantization_config") or text.get("quantization_config") or {}
    if quant:
        block = quant.get("weight_block_size", [32, 32])
        if list(block) != [32, 32]:
            raise CheckpointError(f"{path}: quantization_config.weight_block_size is {block}; V4.1 uses [32, 32]")
        cfg.expert_dtype = quant.get("expert_dtype", "fp4")
    _validate(cfg, where)
    return cfg


def _validate(c: Config, where: str) -> None:
    n_total = c.n_layers + c.n_mtp_layers
    if len(c.compress_ratios) not in (c.n_layers, n_total):
        raise CheckpointError(f"{where}compress_ratios has {len(c.compress_ratios)} entries, expected {n_total}")
    for name, mult in (("hidden_size", c.dim), ("head_dim", c.head_dim), ("q_lora_rank", c.q_lora_rank),
                       ("moe_intermediate_size", c.moe_inter_dim)):
        if mult % 32:
            raise CheckpointError(f"{where}{name} = {mult} is not a multiple of 32 (the FP8 block)")
    if c.score_func not in ("sqrtsoftplus", "sigmoid", "softmax"):
        raise CheckpointError(f"{where}scoring_func {c.score_func!r} is unknown")
    if c.n_shared_experts != 1:
        raise CheckpointError(f"{where}n_shared_experts must be 1 (the reference asserts it)")
    for layer in c.index_source_layers:
        if c.compress_ratios[layer] == 0:
            raise CheckpointError(f"{where}index source layer {layer} has compress ratio 0")


# ---------------------------------------------------------------------------------------------

_DTYPES = {
    "BF16": ml_dtypes.bfloat16,
    "F32": np.float32,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E8M0": ml_dtypes.float8_e8m0fnu,
    "I8": np.int8,
    "U8": np.uint8,
}


@dataclass
class Tensor:
    name: str
    dtype: str
    array: np.ndarray  # decoded values: float32 for float formats, raw bytes (uint8) for I8/U8


class Weights:
    """Tensors by released name; shards are parsed lazily, one at a time, and kept."""

    def __init__(self, ckpt_dir: str):
        self.dir = ckpt_dir
        index_path = os.path.join(ckpt_dir, "model.safetensors.index.json")
        if os.path.exists(index_path):
            try:
                with open(index_path, encoding="utf-8") as f:
                    self.weight_map = json.load(f)["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index_path}: unreadable or no weight_map ({e})") from e
        else:
            single = os.path.join(ckpt_dir, "model.safetensors")
            if not os.path.exists(single):
                raise CheckpointError(f"{ckpt_dir}: neither model.safetensors.index.json nor model.safetensors")
            self.weight_map = {name: "model.safetensors" for name in self._parse(single)}
        self._loaded: dict[str, dict[str, Tensor]] = {}

    def _parse(self, path: str) -> dict[str, Tensor]:
        try:
            with open(path, "rb") as f:
                entries = deserialize(f.read())
        except Exception as e:  # the safetensors parser raises its own error types
            raise CheckpointError(f"{path}: not a valid safetensors file ({e})") from e
        out = {}
        for name, spec in entries:
            dt = spec["dtype"]
            if dt not in _DTYPES:
                raise CheckpointError(f"{path}: tensor {name} has dtype {dt}, not one V4.1 uses")
            raw = np.frombuffer(bytes(spec["data"]), dtype=_DTYPES[dt]).reshape(spec["shape"])
            if dt in ("I8", "U8"):
                arr = raw.view(np.uint8)
            else:
                arr = raw.astype(np.float32)
                if dt == "F8_E8M0" and np.isnan(arr).any():
                    raise CheckpointError(f"{path}: tensor {name} holds the E8M0 NaN code 0xFF")
            out[name] = Tensor(name, dt, arr)
        return out

    def has(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str) -> Tensor:
        shard = self.weight_map.get(name)
        if shard is None:
            raise CheckpointError(f"{self.dir}: tensor {name} is missing from the checkpoint")
        if shard not in self._loaded:
            self._loaded[shard] = self._parse(os.path.join(self.dir, shard))
        tensors = self._loaded[shard]
        if name not in tensors:
            raise CheckpointError(f"{self.dir}/{shard}: tensor {name} listed in the index is not in the shard")
        return tensors[name]

    def array(self, name: str, shape: tuple, dtypes: tuple[str, ...]) -> np.ndarray:
        t = self.get(name)
        if t.dtype not in dtypes:
            raise CheckpointError(f"{self.dir}: tensor {name} is {t.dtype}, expected one of {dtypes}")
        if tuple(t.array.shape) != tuple(shape):
            raise CheckpointError(f"{self.dir}: tensor {name} has shape {list(t.array.shape)}, expected {list(shape)}")
        return t.array

    def digest(self) -> str:
        """sha256 over the index and every shard file, to pin what a golden was made from."""
        h = hashlib.sha256()
        for shard in sorted(set(self.weight_map.values())):
            with open(os.path.join(self.dir, shard), "rb") as f:
                h.update(shard.encode())
                h.update(hashlib.sha256(f.read()).digest())
        return h.hexdigest()


@dataclass
class Linear:
    """A projection weight as the reference's `linear()` dispatches it."""
    kind: str  # "fp8", "fp4", "bf16", "f32"
    weight: np.ndarray  # logical [N, K] values as float32 (E4M3 / E2M1 / bf16 / fp32 values)
    scale: np.ndarray | None  # fp32 E8M0 scales: fp8 [ceil(N/32), ceil(K/32)], fp4 [N, K/32]


def load_linear(w: Weights, name: str, out_features: int, in_features: int, kinds: tuple[str, ...]) -> Linear:
    """`name` without the `.weight` suffix. `kinds` lists what the reference module accepts."""
    t = w.get(name + ".weight")
    if t.dtype == "F8_E4M3":
        kind = "fp8"
        weight = w.array(name + ".weight", (out_features, in_features), ("F8_E4M3",))
        scale = w.array(name + ".scale", (-(-out_features // 32), -(-in_features // 32)), ("F8_E8M0",))
    elif t.dtype in ("I8", "U8"):
        kind = "fp4"
        from numerics import unpack_fp4

        weight = unpack_fp4(w.array(name + ".weight", (out_features, in_features // 2), ("I8", "U8")))
        scale = w.array(name + ".scale", (out_features, in_features // 32), ("F8_E8M0",))
    elif t.dtype == "BF16":
        kind = "bf16"
        weight = w.array(name + ".weight", (out_features, in_features), ("BF16",))
        scale = None
    else:
        kind = "f32"
        weight = w.array(name + ".weight", (out_features, in_features), ("F32",))
        scale = None
    if kind not in kinds:
        raise CheckpointError(f"{w.dir}: {name}.weight is stored as {kind}; the reference module takes {kinds}")
    return Linear(kind, weight, scale)


def dequant_fp8_to_bf16(lin: Linear) -> np.ndarray:
    """convert.py's treatment of wo_a: E4M3 value times its tile scale, as bf16 (exact)."""
    from numerics import bf16

    if lin.kind == "bf16":
        return lin.weight
    n, k = lin.weight.shape
    s = np.repeat(np.repeat(lin.scale, 32, axis=0)[:n], 32, axis=1)[:, :k]
    return bf16((lin.weight * s).astype(np.float32))
