#!/usr/bin/env python3
"""Writes tests/serve/data/tokenizer/: a tiny byte-level BPE tokenizer with DeepSeek-V4.1's control
markers as single added tokens, so the serving tests run the real prompt encoder (which insists on
those markers being single tokens) without shipping the 6 MB V4.1 vocabulary.

Layout: ids 0/1/2 = BOS/EOS/pad (as in DeepSeek's files), 3..258 = the 256 byte-level symbols
(GPT-2's byte-to-unicode map), then the V4.1 markers; the pre-tokenizer and decoder are copied from
DeepSeek-V4's tokenizer.json. No merges: every byte is one token, so token counts are byte counts.
Pure standard library; deterministic output. Run: python3 make_test_tokenizer.py
"""
import json
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizer")


def bytes_to_unicode():
    # GPT-2's map from bytes to printable unicode symbols (the byte-level alphabet).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
MARKERS = ["<｜System｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜",
           "<｜latest_reminder｜>", "<｜deepseek_image｜>"]


def added(i, content):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def main():
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b, sym in sorted(bytes_to_unicode().items()):
        vocab[sym] = len(vocab)
    added_tokens = [added(i, s) for i, s in enumerate(SPECIALS)]
    for m in MARKERS:
        added_tokens.append(added(len(vocab), m))
        vocab[m] = len(vocab)
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
        "normalizer": {"type": "Sequence", "normalizers": []},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"},
             "behavior": "Isolated", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
                                                   "[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
                                                   "\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab, "merges": []},
    }
    config = {"add_bos_token": False, "add_eos_token": False, "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
              "clean_up_tokenization_spaces": False, "model_max_length": 65536}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(OUT, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
