#!/usr/bin/env python3
"""Trains cedar-mini (tools/train/recipe.json) on Python standard library sources.

    train.py --tokenizer TOKENIZER.json --out RUN_DIR [--steps N] [--resume]

Writes RUN_DIR/config.json (the released-layout config), RUN_DIR/state.pt (weights, router
biases, optimiser), RUN_DIR/train_log.jsonl (one line per logged step), RUN_DIR/corpus.json (the
train / held-out file split with sizes and a digest of the token stream) and, at the end, the
held-out cross-entropy and top-1 accuracy computed by this model. export.py turns the state into a
checkpoint cedar loads.

Deterministic for a given recipe, corpus, torch version and thread count: batches come from a
seeded numpy generator, torch is seeded, and no op here picks its algorithm by timing.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "golden"))

from checkpoint import load_config  # noqa: E402
from engram_hash import EngramHasher, build_compressed_token_map, engram_primes  # noqa: E402
from model import MiniV41, index_kl_loss  # noqa: E402

BOS, EOS = 0, 1


def hf_config(recipe: dict, n_classes: int) -> dict:
    text = dict(recipe["text_config"])
    text["engram_compressed_vocab_size"] = n_classes
    primes = engram_primes(len(text["engram_layer_ids"]), text["engram_max_ngram_size"], text["engram_n_heads"],
                           text["engram_vocab_size"])
    text["engram_num_embeddings"] = [sum(p for order in layer for p in order) for layer in primes]
    return {
        "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41", "bos_token_id": BOS,
        "eos_token_id": EOS, "pad_token_id": 2, "image_token_id": 129264, "dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                                "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
        "text_config": text,
    }


# ---------------------------------------------------------------------------------------------
# Corpus


def corpus_files(recipe: dict) -> tuple[list[str], list[str]]:
    """Sorted source files, split by a hash of their path relative to the root: every
    `held_out_every`-th bucket is held out, so the split does not depend on what else is there."""
    t = recipe["train"]
    train, held = [], []
    for root in t["corpus_roots"]:
        for path in sorted(glob.glob(os.path.join(root, t["corpus_glob"]), recursive=True)):
            if not os.path.isfile(path):
                continue
            rel = os.path.relpath(path, root)
            bucket = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % t["held_out_every"]
            (held if bucket == 0 else train).append(path)
    return train, held


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None


def tokenize_files(tok, paths: list[str]) -> list[np.ndarray]:
    texts = [read_text(p) for p in paths]
    keep = [(p, t) for p, t in zip(paths, texts) if t]
    enc = tok.encode_batch([t for _, t in keep], add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int64) for e in enc]


# ---------------------------------------------------------------------------------------------
# Engram hash ids for sequences that start at position 0 (numpy, vectorised over the batch)


def engram_hash_ids(hasher: EngramHasher, ids: np.ndarray) -> np.ndarray:
    """ids [B, T] -> [B, T, n_layers, (max_ngram-1)*n_heads] table rows, as EngramHashState."""
    B, T = ids.shape
    n = hasher.max_ngram_size
    cls = hasher.token_map[ids]  # [B, T]
    padded = np.concatenate([np.full((B, n - 1), hasher.pad_class, np.int64), cls], 1)
    shifted = [padded[:, n - 1 - k: n - 1 - k + T] for k in range(n)]  # u_k = class at pos - k
    n_cols = (n - 1) * hasher.n_heads
    out = np.zeros((B, T, len(hasher.layer_ids), n_cols), np.int64)
    for li in range(len(hasher.layer_ids)):
        rolling = shifted[0] * hasher.multipliers[li, 0]
        for order in range(1, n):
            rolling = rolling ^ (shifted[order] * hasher.multipliers[li, order])
            for head in range(hasher.n_heads):
                col = (order - 1) * hasher.n_heads + head
                out[:, :, li, col] = rolling % hasher.primes[li, order - 1, head] + hasher.offsets[li, col]
    return out


class Batches:
    """Samples: BOS + a window of the train stream (files joined by EOS) at a seeded offset."""

    def __init__(self, stream: np.ndarray, seq_len: int, batch: int, seed: int):
        self.stream, self.T, self.B = stream, seq_len, batch
        self.rng = np.random.default_rng(seed)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self.rng.integers(0, len(self.stream) - self.T, size=self.B)
        win = np.stack([self.stream[s: s + self.T] for s in starts])  # [B, T]
        inputs = np.concatenate([np.full((self.B, 1), BOS, np.int64), win[:, :-1]], 1)
        return inputs, win


# ---------------------------------------------------------------------------------------------


def lr_at(step: int, t: dict) -> float:
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    total = t.get("schedule_steps", t["steps"])  # the cosine's length; training may stop before its end
    frac = (step - t["warmup_steps"]) / max(1, total - t["warmup_steps"])
    return t["lr"] * (t["lr_min_ratio"] + (1 - t["lr_min_ratio"]) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


@torch.no_grad()
def evaluate(model: MiniV41, hasher, files: list[np.ndarray], seq_len: int) -> dict:
    """Held-out files scored from their start, in non-overlapping windows of seq_len tokens, each
    window fed as BOS + the previous seq_len-1 tokens (as `cedar eval` does with --ctx). A short
    last window is padded at its end (causal: the padding changes no scored position)."""
    model.eval()
    ce_sum, hits, n = 0.0, 0, 0
    for toks in files:
        for s in range(0, len(toks), seq_len):
            tgt = toks[s: s + seq_len]
            inp = np.concatenate([[BOS], toks[s: s + len(tgt) - 1]])
            inp = np.concatenate([inp, np.full(seq_len - len(inp), EOS, np.int64)])[None]
            final, _ = model(torch.from_numpy(inp), torch.from_numpy(engram_hash_ids(hasher, inp)))
            logits = model.head_logits(final[0, : len(tgt)])
            zero_col = torch.full((len(tgt), 1), model.log_zero_rows)
            lse = torch.logsumexp(torch.cat([logits, zero_col], -1), -1)
            slot = model.head_slot[torch.from_numpy(tgt)]
            tl = torch.where(slot >= 0, logits.gather(1, slot.clamp_min(0)[:, None])[:, 0], torch.zeros_like(lse))
            ce_sum += float((lse - tl).sum())
            best = logits.max(-1)
            pred = torch.where(best.values > 0, model.head_ids[best.indices], torch.full_like(slot, -1))
            hits += int((pred == torch.from_numpy(tgt)).sum())
            n += len(tgt)
    model.train()
    return {"tokens": n, "cross_entropy": ce_sum / n, "top1": hits / n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=os.path.join(HERE, "recipe.json"))
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json (the V4.1 vocabulary make-tiny ships)")
    ap.add_argument("--out", required=True, help="run directory")
    ap.add_argument("--steps", type=int, help="override the recipe's step count (trial runs)")
    ap.add_argument("--eval-files", type=int, default=0, help="held-out files to score at the end (0: all, -1: none)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    with open(args.recipe) as f:
        recipe = json.load(f)
    t = recipe["train"]
    if args.steps:
        t["steps"] = args.steps
    torch.manual_seed(t["seed"])
    torch.set_num_threads(t["threads"])
    os.makedirs(args.out, exist_ok=True)

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(args.tokenizer)
    token_map, n_classes = build_compressed_token_map(args.tokenizer)
    config = hf_config(recipe, n_classes)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    cfg = load_config(os.path.join(args.out, "config.json"))
    hasher = EngramHasher.from_config(cfg, token_map, n_classes)

    train_paths, held_paths = corpus_files(recipe)
    train_tok = tokenize_files(tok, train_paths)
    held_tok = tokenize_files(tok, held_paths)
    stream = np.concatenate([np.concatenate([a, [EOS]]) for a in train_tok])
    counts = np.bincount(stream, minlength=cfg.vocab_size)
    head_ids = np.sort(np.argsort(-counts, kind="stable")[: t["head_vocab"]])
    embed_ids = np.unique(np.concatenate([stream, [BOS]]))
    with open(os.path.join(args.out, "corpus.json"), "w") as f:
        json.dump({"train_files": train_paths,
                   "held_out_files": held_paths, "train_tokens": int(len(stream)),
                   "held_out_tokens": int(sum(len(a) for a in held_tok)),
                   "stream_sha256": hashlib.sha256(stream.tobytes()).hexdigest(),
                   "head_vocab": int(len(head_ids)), "embed_rows": int(len(embed_ids)),
                   "head_coverage": float(counts[head_ids].sum() / counts.sum())}, f, indent=1)
    print(f"corpus: {len(train_paths)} train files ({len(stream)} tokens), {len(held_paths)} held out "
          f"({sum(len(a) for a in held_tok)} tokens); head covers {counts[head_ids].sum() / counts.sum():.4f}",
          file=sys.stderr)

    model = MiniV41(cfg, head_ids, embed_ids)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "eng_table" not in n and n != "embed"]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "eng_table" not in n and n != "embed")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=t["lr"], betas=(0.9, 0.95))
    batches = Batches(stream, t["seq_len"], t["batch"], t["seed"])
    start = 0
    state_path = os.path.join(args.out, "state.pt")
    if os.path.exists(state_path):
        st = torch.load(state_path, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        batches.rng.bit_generator.state = st["rng"]
        start = st["step"]
        print(f"resumed at step {start}", file=sys.stderr)

    log = open(os.path.join(args.out, "train_log.jsonl"), "a")
    if start == 0:
        log.write(json.dumps({"event": "start", "params": n_params, "torch": torch.__version__,
                              "threads": t["threads"], "recipe": recipe}) + "\n")

    def save(step):
        tmp = state_path + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": batches.rng.bit_generator.state,
                    "step": step, "head_ids": head_ids, "embed_ids": embed_ids}, tmp)
        os.replace(tmp, state_path)

    try:
        from tqdm import tqdm
        bar = tqdm(total=t["steps"], initial=start, disable=args.no_progress, dynamic_ncols=True)
    except ImportError:
        bar = None
    t0, tokens_done, ema = time.time(), 0, None
    for step in range(start, t["steps"]):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, t)
        inputs, targets = batches.next()
        final, aux = model(torch.from_numpy(inputs), torch.from_numpy(engram_hash_ids(hasher, inputs)))
        ce, acc = model.loss(final, torch.from_numpy(targets))
        kl = index_kl_loss(aux)
        loss = ce + t["index_loss_weight"] * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        model.update_router_bias(t["router_bias_rate"])
        tokens_done += inputs.size
        ema = ce.item() if ema is None else 0.95 * ema + 0.05 * float(ce)
        if bar:
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}", acc=f"{float(acc):.3f}", idx_kl=f"{float(kl):.3f}",
                            tok_s=f"{tokens_done / (time.time() - t0):.0f}")
        if step % 25 == 0 or step == t["steps"] - 1:
            log.write(json.dumps({"step": step, "ce": round(float(ce), 4), "top1": round(float(acc), 4),
                                  "index_kl": round(float(kl), 4), "grad_norm": round(float(gnorm), 3),
                                  "lr": lr_at(step, t),
                                  "elapsed_s": round(time.time() - t0, 1)}) + "\n")
            log.flush()
        if step % 200 == 199:
            save(step + 1)
    if bar:
        bar.close()
    save(t["steps"])
    if args.eval_files < 0:
        log.close()
        return 0
    files = held_tok if args.eval_files == 0 else held_tok[: args.eval_files]
    result = evaluate(model, hasher, files, t["seq_len"])
    log.write(json.dumps({"event": "held_out", **result}) + "\n")
    log.close()
    print(json.dumps({"held_out": result}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
