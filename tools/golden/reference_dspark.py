#!/usr/bin/env python3
"""Independent numpy implementation of the official DSpark draft forward pass
(`Transformer.forward_spec`, `DSparkBlock`, `DSparkAttention`, `DSparkMarkovHead`,
`DSparkConfidenceHead` of inference/model.py; docs/DSPARK.md) on top of reference_forward.py's
backbone, for golden outputs.

It runs the backbone's greedy loop (one prefill call, then one token per call, as
reference_forward.py does) and after every call the draft as the reference wires it:
`forward_spec(next_id, main_hidden, start_pos)`. The prefill call only seeds the stages' window
rings; every decode call drafts one block and the output records its draft ids, the 5 positions'
fp32 logits (with the Markov bias; top-32 and moments) and the confidence scores.

    reference_dspark.py --checkpoint DIR --prompt-text TEXT --prompt-len 64 --decode-steps 3 --out g.json

Greedy: the draft samples with temperature 0 (argmax, ties to the lower id).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numerics as nx  # noqa: E402
from checkpoint import CheckpointError, load_linear  # noqa: E402
from reference_forward import (ReferenceModel, config_digest, j32, linear, write_report,  # noqa: E402
                               logits_summary)

F32 = np.float32
F64 = np.float64
FORMAT = "cedar-dspark-golden-v1"


class DSparkReference:
    """The draft stages mtp.0 .. mtp.{n-1} of a ReferenceModel's checkpoint, and their window rings."""

    def __init__(self, model: ReferenceModel):
        c = model.cfg
        if c.n_mtp_layers <= 0 or c.dspark_block_size <= 0:
            raise CheckpointError(f"{model.dir}: the config has no DSpark stages (num_nextn_predict_layers, "
                                  "dspark_block_size)")
        if not c.dspark_target_layer_ids:
            raise CheckpointError(f"{model.dir}: dspark_target_layer_ids is empty")
        for s in range(c.n_mtp_layers):
            if c.compress_ratios[c.n_layers + s] != 0:
                raise CheckpointError(f"{model.dir}: DSpark stage {s} must be window-only (compress ratio 0)")
        self.m = model
        self.n_experts = c.dspark_n_routed_experts or c.n_routed_experts
        self.top_k = c.dspark_n_activated_experts or c.n_activated_experts
        self.stages = [self._load_stage(s) for s in range(c.n_mtp_layers)]
        self.router_ties = 0
        self.reset()

    def _load_stage(self, s: int) -> dict:
        m, c, w = self.m, self.m.cfg, self.m.w
        d = c.dim
        p = f"mtp.{s}."
        lw = m.load_block_core(p)  # the stage is a Block (window-only attention)
        lw.update(m.load_moe(p + "ffn.", self.n_experts))
        if s == 0:  # DSparkBlock.__init__: stage 0 projects the target layers' hidden states
            n_t = len(c.dspark_target_layer_ids)
            lw["main_proj"] = load_linear(w, p + "main_proj", d, n_t * d, ("fp8",))
            lw["main_norm"] = m._norm(p + "main_norm.weight", d)
        if s == c.n_mtp_layers - 1:  # the last stage owns the output heads
            r, V = c.dspark_markov_rank, c.vocab_size
            lw["norm"] = m._norm(p + "norm.weight", d)
            lw["markov_embed"] = w.array(p + "markov_head.embed.weight", (V, r), ("BF16",)).astype(F32)
            # ParallelHead keeps its weight as an fp32 parameter (exact copy of the bf16 values)
            lw["markov_head"] = w.array(p + "markov_head.head.weight", (V, r), ("BF16", "F32")).astype(F32)
            lw["confidence"] = w.array(p + "confidence_head.proj.weight", (1, d + r), ("BF16", "F32")).astype(F32)
        return lw

    def reset(self):
        c = self.m.cfg
        self.rings = [np.zeros((c.window_size, c.head_dim), F32) for _ in self.stages]

    # -----------------------------------------------------------------------------------------

    def _rope(self, positions):
        return nx.rope_cos_sin(np.asarray(positions), self.m.inv_freq_swa)  # ratio 0: base theta, no YaRN

    def attention(self, s: int, x: np.ndarray | None, main_x: np.ndarray, p0: int) -> np.ndarray | None:
        """DSparkAttention.forward. x [B, dim] (None at prefill), main_x [S, dim]."""
        c, lw, ring = self.m.cfg, self.stages[s], self.rings[s]
        win, eps, s_len = c.window_size, c.norm_eps, main_x.shape[0]
        main_kv = nx.rms_norm(linear(main_x, lw["wkv"]), lw["kv_norm"], eps)
        main_kv = nx.fp8_qdq(nx.apply_rope(main_kv, *self._rope(range(p0, p0 + s_len))))
        if p0 == 0:  # prefill seeds the ring (position p in slot p mod window) and drafts nothing
            for pos in range(max(0, s_len - win), s_len):
                ring[pos % win] = main_kv[pos]
            return None
        b = x.shape[0]
        cos, sin = self._rope(range(p0 + s_len, p0 + s_len + b))
        qr = nx.rms_norm(linear(x, lw["wq_a"]), lw["q_norm"], eps)
        q = nx.apply_rope(linear(qr, lw["wq_b"]).reshape(b, c.n_heads, c.head_dim), cos, sin)
        kv = nx.fp8_qdq(nx.apply_rope(nx.rms_norm(linear(x, lw["wkv"]), lw["kv_norm"], eps), cos, sin))
        ring[p0 % win] = main_kv[0]
        operand = np.concatenate([ring, kv], axis=0)  # [win + B, head_dim]
        # get_dspark_topk_idxs: the filled ring slots in slot order, then every draft row (no causal mask)
        row = np.concatenate([np.arange(min(win, p0 + 1)), win + np.arange(b)])
        idx = np.repeat(row[None, :], b, axis=0)
        o = nx.sparse_attn(q, operand, lw["attn_sink"], idx, c.head_dim ** -0.5)
        o = nx.apply_rope(o, cos, sin, inverse=True).reshape(b, c.o_groups, -1)
        t = nx.bf16(nx.f32(np.einsum("sgd,grd->sgr", o.astype(F64), lw["wo_a"].astype(F64))))
        return linear(t.reshape(b, -1), lw["wo_b"])

    def moe(self, s: int, x: np.ndarray) -> np.ndarray:
        """MoE with the stages' expert count (ModelArgs.get_moe_config); same router as the backbone."""
        y, ties = self.m.moe_of(self.stages[s], x, self.n_experts, self.top_k)
        self.router_ties += ties
        return y

    def block(self, s: int, streams: np.ndarray, pre_mix: np.ndarray, main_x: np.ndarray, p0: int):
        """Block.forward around DSparkAttention (decode only)."""
        return self.m.block_of(self.stages[s], streams, pre_mix, lambda x: self.attention(s, x, main_x, p0),
                               lambda x: self.moe(s, x))

    def forward_spec(self, token: int, main_hidden: np.ndarray, p0: int):
        """Transformer.forward_spec for one sequence. main_hidden [S, n_targets * dim] is the backbone
        call's hook output; token the id that call produced. None at prefill, else (ids [B+1],
        logits [B, vocab] fp32, confidence [B] fp32)."""
        c = self.m.cfg
        B, first, last = c.dspark_block_size, self.stages[0], self.stages[-1]
        main_x = nx.rms_norm(linear(main_hidden, first["main_proj"]), first["main_norm"], c.norm_eps)
        if p0 == 0:
            for s in range(len(self.stages)):
                self.attention(s, None, main_x, 0)
            return None
        ids = np.full(B, c.dspark_noise_token_id, dtype=np.int64)
        ids[0] = token
        h = self.m.embed[ids]  # [B, dim] bf16
        streams = np.repeat(h[:, None, :], c.hc_mult, axis=1)
        pre_mix = np.zeros((B, c.hc_mult), F32)
        pre_mix[:, 0] = 1
        for s in range(len(self.stages)):
            streams, pre_mix = self.block(s, streams, pre_mix, main_x, p0)
        # DSparkBlock.forward_head
        x = nx.hc_pre(streams, pre_mix)  # [B, dim] bf16
        logits = nx.linear_f32(nx.rms_norm(x, last["norm"], c.norm_eps), self.m.head)  # [B, vocab]
        out = np.empty(B + 1, dtype=np.int64)
        out[0] = token
        embeds = np.empty((B, c.dspark_markov_rank), F32)
        for i in range(B):
            embeds[i] = last["markov_embed"][out[i]]
            bias = nx.linear_f32(embeds[i][None], last["markov_head"])[0]
            logits[i] = (logits[i] + bias).astype(F32)
            out[i + 1] = int(np.argmax(logits[i]))  # temperature 0; argmax keeps the lower id on ties
        confidence = nx.linear_f32(np.concatenate([x, embeds], axis=-1), last["confidence"])[:, 0]
        return out, logits, confidence


def draft_logits_summary(logits: np.ndarray) -> dict:
    """Top-16 (id, value) of one draft position, descending, ties to the lower id, and moments."""
    full = logits_summary(logits, 0, False)
    return {"top": full["top"][:16], **{k: full[k] for k in ("sum", "sum_abs", "sum_sq", "min", "max")}}


def run(args) -> dict:
    import ml_dtypes
    import tokenizers
    from tokenizers import Tokenizer

    model = ReferenceModel(args.checkpoint, args.index_keys, args.max_seq_len)
    draft = DSparkReference(model)
    tok = Tokenizer.from_file(os.path.join(args.checkpoint, "tokenizer.json"))
    prompt = [0] + tok.encode(args.prompt_text, add_special_tokens=False).ids
    if len(prompt) < args.prompt_len:
        raise ValueError(f"--prompt-text gives {len(prompt)} tokens, fewer than --prompt-len {args.prompt_len}")
    prompt = prompt[: args.prompt_len]
    model.reset()
    steps, ids, pos, greedy = [], list(prompt), 0, []
    for step in range(args.decode_steps + 1):
        logits, _ = model.forward(ids, pos)
        nxt = int(np.argmax(logits))
        greedy.append(nxt)
        result = draft.forward_spec(nxt, model.main_hidden, pos)
        if result is not None:
            out, dlogits, conf = result
            steps.append({"start_pos": pos, "token": nxt, "draft_ids": [int(t) for t in out[1:]],
                          "confidence": [j32(v) for v in conf],
                          "logits": [draft_logits_summary(dlogits[i]) for i in range(dlogits.shape[0])]})
        pos += len(ids)
        ids = [nxt]
        if nxt == model.cfg.eos_token_id or (model.hasher is not None and nxt >= len(model.hasher.token_map)):
            break
    return {
        "format": FORMAT,
        "generator": {"script": "tools/golden/reference_dspark.py", "numpy": np.__version__,
                      "ml_dtypes": ml_dtypes.__version__, "tokenizers": tokenizers.__version__},
        "checkpoint": {"name": os.path.basename(os.path.normpath(args.checkpoint)), "weights_sha256": model.w.digest(),
                       **config_digest(model)},
        "index_keys": args.index_keys,
        "tie_rule": "lower index first",
        "prompt_ids": prompt,
        "greedy_ids": greedy,
        "router_ties": draft.router_ties,
        "steps": steps,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--prompt-text", required=True, help="text, tokenized with the checkpoint's tokenizer.json "
                    "after BOS (id 0)")
    ap.add_argument("--prompt-len", type=int, required=True)
    ap.add_argument("--decode-steps", type=int, default=3, help="backbone decode calls, each followed by a draft")
    ap.add_argument("--index-keys", choices=("reference", "owner"), default="reference")
    ap.add_argument("--max-seq-len", type=int, default=4096)
    ap.add_argument("--out", help="output JSON (default: stdout)")
    args = ap.parse_args(argv)
    try:
        out = run(args)
    except (CheckpointError, ValueError) as e:
        print(f"reference_dspark: {e}", file=sys.stderr)
        return 1
    body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in out.items())
    write_report("{\n" + body + "\n}", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
