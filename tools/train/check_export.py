#!/usr/bin/env python3
"""Checks an exported cedar-mini against the training model: the torch model of the run and the
independent numpy reference (tools/golden) read from the exported checkpoint must give nearly the
same last-position logits for prompts of several lengths (crossing the window, the index top-k and
the candidate pool). The torch side runs in fp32 without the reference's bf16 roundings and FP8
activation quantisation, so agreement is close, not exact: the report gives the relative L2
difference and whether the argmax agrees.

    check_export.py --run RUN_DIR --model MODEL_DIR [--lengths 8,40,100] [--text-file F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("CEDAR_TRAIN_COMPILE", "0")

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "golden"))

from checkpoint import load_config  # noqa: E402
from engram_hash import EngramHasher, build_compressed_token_map  # noqa: E402
from model import MiniV41  # noqa: E402
from reference_forward import ReferenceModel  # noqa: E402
from train import BOS, engram_hash_ids  # noqa: E402


def full_logits(model: MiniV41, final: torch.Tensor) -> np.ndarray:
    """All vocabulary logits of one position: trained rows from the head, zero elsewhere."""
    out = np.zeros(model.cfg.vocab_size, np.float32)
    with torch.no_grad():
        out[model.head_ids.numpy()] = model.head_logits(final).numpy()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--lengths", default="8,40,100")
    ap.add_argument("--text-file", default=os.path.join(HERE, "train.py"), help="text whose tokens form the prompts")
    args = ap.parse_args(argv)

    cfg = load_config(os.path.join(args.run, "config.json"))
    st = torch.load(os.path.join(args.run, "state.pt"), weights_only=False)
    model = MiniV41(cfg, st["head_ids"], st["embed_ids"])
    model.load_state_dict(st["model"])
    model.eval()
    tok_path = os.path.join(args.model, "tokenizer.json")
    token_map, n_classes = build_compressed_token_map(tok_path)
    hasher = EngramHasher.from_config(cfg, token_map, n_classes)
    from tokenizers import Tokenizer

    with open(args.text_file, encoding="utf-8") as f:
        ids = Tokenizer.from_file(tok_path).encode(f.read(), add_special_tokens=False).ids
    ref = ReferenceModel(args.model, index_keys="owner")
    rows = []
    for n in (int(x) for x in args.lengths.split(",")):
        prompt = [BOS] + ids[: n - 1]
        inp = np.asarray(prompt, np.int64)[None]
        with torch.no_grad():
            final, _ = model(torch.from_numpy(inp), torch.from_numpy(engram_hash_ids(hasher, inp)))
        a = full_logits(model, final[0, -1])
        ref.reset()
        b, _ = ref.forward(prompt, 0)
        rel = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
        rows.append({"prompt_tokens": n, "rel_l2": round(rel, 5), "argmax_torch": int(a.argmax()),
                     "argmax_reference": int(b.argmax())})
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
