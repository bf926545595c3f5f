#!/usr/bin/env python3
"""Writes the fuzzer's seed corpus (corpus/): a few valid safetensors files and near-misses.
Standard library only; rerun after changing the list: python3 tests/io/fuzz/make_seeds.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def st(header, data=b"", length=None):
    text = header if isinstance(header, str) else json.dumps(header, separators=(",", ":"))
    raw = text.encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


SEEDS = {
    "empty_header": st("{}"),
    "padded_header": st("{}      "),
    "one_f32": st({"a": entry("F32", [2], 0, 8)}, bytes(8)),
    "all_dtypes": st({
        "__metadata__": {"format": "pt"},
        "bf16": entry("BF16", [2, 2], 0, 8), "f16": entry("F16", [2], 8, 12),
        "f32": entry("F32", [1], 12, 16), "e4m3": entry("F8_E4M3", [4], 16, 20),
        "e8m0": entry("F8_E8M0", [2], 20, 22), "i8": entry("I8", [2, 1], 22, 24),
        "u8": entry("U8", [1], 24, 25), "i32": entry("I32", [1], 25, 29),
        "i64": entry("I64", [1], 29, 37), "scalar": entry("F32", [], 37, 41),
        "empty": entry("F32", [0, 3], 41, 41)}, bytes(41)),
    "overlap": st({"a": entry("U8", [8], 0, 8), "b": entry("U8", [8], 4, 12)}, bytes(12)),
    "truncated": st({"a": entry("F32", [4], 0, 16)}, bytes(5)),
    "size_mismatch": st({"a": entry("F32", [3], 0, 8)}, bytes(8)),
    "huge_shape": st({"a": entry("U8", [4294967296, 4294967296], 0, 0)}),
    "unknown_dtype": st({"a": entry("Q7", [1], 0, 1)}, bytes(1)),
    "bad_metadata": st({"__metadata__": {"k": 1}}),
    "length_lies": st("{}", length=1000),
    "not_object": st("[1,2,3]"),
}


def main():
    out = os.path.join(HERE, "corpus")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
