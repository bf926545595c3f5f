#!/usr/bin/env python3
"""Exports a cedar-mini training run in the released DeepSeek-V4.1 checkpoint layout.

    export.py --run RUN_DIR --tokenizer-dir DIR --out MODEL_DIR

Tensor names, dtypes and block scales are those of the released checkpoint (and of cedar
make-tiny): FP8 E4M3 dense weights with one E8M0 scale per 32x32 tile, FP4 E2M1 experts packed two
per byte with one E8M0 scale per row per 32, bf16 norms / compressor / indexer keys / router /
embeddings, fp32 mHC parameters, sinks and router biases, FP8 Engram tables with a scale per row
per 32. The quantisers are the golden reference's (tools/golden/make_tiny_checkpoint.py), the same
rules the training's straight-through estimators apply, so cedar computes what was trained.

Vocabulary rows the run never trained export as: embedding = the shared row for unseen ids, head =
zero (logit exactly 0, as the training loss assumed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import ml_dtypes
import numpy as np
import torch
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "golden"))

from make_tiny_checkpoint import quantize_fp4, quantize_fp8  # noqa: E402


def export(run_dir: str, tokenizer_dir: str, out_dir: str) -> dict:
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    c = config["text_config"]
    st = torch.load(os.path.join(run_dir, "state.pt"), weights_only=False)
    p = {k: v.detach().float().numpy() for k, v in st["model"].items()}
    V, d = c["vocab_size"], c["hidden_size"]
    tensors: dict[str, np.ndarray] = {}

    def bf16(name, v):
        tensors[name] = np.ascontiguousarray(v, np.float32).astype(ml_dtypes.bfloat16)

    def f32(name, v):
        tensors[name] = np.ascontiguousarray(v, np.float32)

    def fp8(name, v, per_row=False):
        tensors[name + ".weight"], tensors[name + ".scale"] = quantize_fp8(np.asarray(v, np.float32), per_row)

    def fp4(name, v):
        tensors[name + ".weight"], tensors[name + ".scale"] = quantize_fp4(np.asarray(v, np.float32))

    embed = np.repeat(p["embed"][:1], V, axis=0)
    embed[st["embed_ids"]] = p["embed"][1:]
    bf16("embed.weight", embed)
    head = np.zeros((V, d), np.float32)
    head[st["head_ids"]] = p["head"]
    bf16("head.weight", head)
    bf16("norm.weight", p["norm"])
    for L in range(c["num_hidden_layers"]):
        q, out = f"layers.{L}.", f"layers.{L}."
        src = lambda n: p[q + n]  # noqa: E731
        bf16(out + "attn_norm.weight", src("attn_norm"))
        bf16(out + "ffn_norm.weight", src("ffn_norm"))
        for site in ("attn", "ffn"):
            for part in ("fn", "base", "scale"):
                f32(out + f"hc_{site}_{part}", src(f"hc_{site}_{part}"))
        a = out + "attn."
        f32(a + "attn_sink", src("attn_sink"))
        fp8(a + "wq_a", src("wq_a"))
        bf16(a + "q_norm.weight", src("q_norm"))
        fp8(a + "wq_b", src("wq_b"))
        fp8(a + "wkv", src("wkv"))
        bf16(a + "kv_norm.weight", src("kv_norm"))
        fp8(a + "wo_a", src("wo_a"))
        fp8(a + "wo_b", src("wo_b"))
        if L in c["kv_source_layer_ids"]:
            bf16(a + "compressor.wkv.weight", src("cmp_wkv"))
            if c["compress_ratios"][L] > 1:
                bf16(a + "compressor.wgate.weight", src("cmp_wgate"))
            bf16(a + "compressor.norm.weight", src("cmp_norm"))
            bf16(a + "indexer.wk.weight", src("idx_wk"))
            bf16(a + "indexer.k_norm.weight", src("idx_k_norm"))
        if L in c["index_source_layer_ids"]:
            fp8(a + "indexer.wq_b", src("idx_wq_b"))
            bf16(a + "indexer.weights_proj.weight", src("idx_weights_proj"))
        fo = out + "ffn."
        bf16(fo + "gate.weight", src("gate_w"))
        f32(fo + "gate.bias", src("gate_b"))
        for e in range(c["n_routed_experts"]):
            fp4(fo + f"experts.{e}.w1", src("w1")[e])
            fp4(fo + f"experts.{e}.w3", src("w3")[e])
            fp4(fo + f"experts.{e}.w2", src("w2")[e])
        fp8(fo + "shared_experts.w1", src("sw1"))
        fp8(fo + "shared_experts.w3", src("sw3"))
        fp8(fo + "shared_experts.w2", src("sw2"))
        if L in c["engram_layer_ids"]:
            e = out + "engram."
            fp8(e + "embed", src("eng_table"), per_row=True)
            fp8(e + "wkv", src("eng_wkv"))
            # The model uses q_weight * k_weight only; training learns the product.
            bf16(e + "q_weight", src("eng_qk"))
            bf16(e + "k_weight", np.ones_like(src("eng_qk")))

    os.makedirs(out_dir, exist_ok=True)
    for old in os.listdir(out_dir):
        if old.endswith(".safetensors"):
            os.remove(os.path.join(out_dir, old))
    # Shards: embedding, head (each ~50 MB, under hosting sites' 100 MB file limit), then layers.
    names = sorted(tensors)
    shards = [["embed.weight"], ["head.weight", "norm.weight"]]
    n_layers = c["num_hidden_layers"]
    layer_shards = 2
    for s in range(layer_shards):
        shards.append([n for n in names if n.startswith("layers.")
                       and int(n.split(".")[1]) * layer_shards // n_layers == s])
    assert sum(len(s) for s in shards) == len(names), "every tensor goes to one shard"
    weight_map, total = {}, 0
    for i, members in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in members}, os.path.join(out_dir, fname), metadata={"format": "pt"})
        os.chmod(os.path.join(out_dir, fname), 0o644)
        for n in members:
            weight_map[n] = fname
            total += tensors[n].nbytes
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(out_dir, name))
    return {"tensors": len(names), "bytes": total, "step": int(st["step"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="training run directory (config.json, state.pt)")
    ap.add_argument("--tokenizer-dir", required=True, help="folder with tokenizer.json + tokenizer_config.json")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    print(json.dumps(export(args.run, args.tokenizer_dir, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
