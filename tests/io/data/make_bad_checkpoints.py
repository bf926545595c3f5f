#!/usr/bin/env python3
"""Writes tests/io/data/checkpoints/: one sound sharded checkpoint and broken copies of it, for
tests/io/cli_broken_checkpoints.sh (cedar check-shards must exit 1 naming the shard and tensor).
Standard library only, byte layout spelled out here (independent of cedar's writer). Rerun after
changing a case: python3 tests/io/data/make_bad_checkpoints.py"""
import json
import os
import shutil
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoints")
S1 = "model-00001-of-00002.safetensors"
S2 = "model-00002-of-00002.safetensors"
SIZES = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1}


def shard(tensors, lie=None):
    """tensors: [(name, dtype, shape)], laid back to back; lie(name, entry) may edit the header."""
    header, data, offset = {}, b"", 0
    for i, (name, dtype, shape) in enumerate(tensors):
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        data += bytes((i * 16 + k) % 256 for k in range(n))
        offset += n
    if lie:
        lie(header)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + data


SHARD1 = [("embed.weight", "BF16", [4, 4]), ("norm.weight", "F32", [8])]
SHARD2 = [("layers.0.ffn.w2.weight", "I8", [4, 2]), ("layers.0.ffn.w2.scale", "F8_E8M0", [4, 1])]
INDEX = {name: S1 for name, _, _ in SHARD1} | {name: S2 for name, _, _ in SHARD2}


def write_case(case, shards, index):
    d = os.path.join(HERE, case)
    os.makedirs(d)
    for name, blob in shards.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": index}, f, indent=1, sort_keys=True)


def overlap(header):
    # norm.weight claims bytes that embed.weight owns; its size still matches its shape.
    header["norm.weight"]["data_offsets"] = [16, 48]


def bad_dtype(header):
    header["layers.0.ffn.w2.scale"]["dtype"] = "F8_E8M1"


def main():
    shutil.rmtree(HERE, ignore_errors=True)
    good = {S1: shard(SHARD1), S2: shard(SHARD2)}
    write_case("good", good, INDEX)
    write_case("truncated", {S1: good[S1], S2: good[S2][:-3]}, INDEX)
    write_case("lying_offsets", {S1: shard(SHARD1, overlap), S2: good[S2]}, INDEX)
    write_case("wrong_dtype", {S1: good[S1], S2: shard(SHARD2, bad_dtype)}, INDEX)
    write_case("missing_tensor", good, INDEX | {"head.weight": S1})
    write_case("missing_shard", {S1: good[S1]}, INDEX)
    write_case("path_traversal", good, INDEX | {"embed.weight": "../good/" + S1})


if __name__ == "__main__":
    main()
