#!/usr/bin/env python3
"""Independent safetensors oracle for cedar's io tests (reference: the `safetensors` package).

  write OUT   serialize the io test sample (tests/io/writer_test.cc, kSample) with the reference
              writer, in the reference's own tensor order, without metadata (the reference writes
              "__metadata__" keys in hash order, which changes from run to run)
  list FILE   read FILE with the reference reader and print one line per metadata key and per
              tensor (sorted by name): `name DTYPE [shape] hexbytes`

Pinned in tools/oracles/requirements-io.txt; tools/oracles/regen_io_oracle.sh reruns it and refreshes
tests/io/data/. CI never needs this venv: the outputs are committed.
"""
import ctypes
import sys

from safetensors import TensorSpec, deserialize, safe_open, serialize_file

# name, safetensors dtype, reference dtype name, shape, element bytes, pattern seed.
# Must match kSample in tests/io/writer_test.cc: bytes are (seed + i) mod 256.
SAMPLE = [
    ("layers.0.ffn.experts.3.w1.weight", "I8", "int8", [2, 3], 1, 1),
    ("layers.0.ffn.experts.3.w1.scale", "F8_E8M0", "float8_e8m0fnu", [2, 1], 1, 17),
    ("embed.weight", "BF16", "bfloat16", [3, 2], 2, 33),
    ("layers.0.attn.wq_a.weight", "F8_E4M3", "float8_e4m3fn", [2, 4], 1, 49),
    ("norm.weight", "F32", "float32", [3], 4, 65),
    ("half", "F16", "float16", [5], 2, 81),
    ("positions", "I64", "int64", [2], 8, 97),
    ("ids", "I32", "int32", [3], 4, 113),
    ("mask", "U8", "uint8", [1], 1, 129),
    ("empty", "F32", "float32", [0, 3], 4, 145),
    ("scalar", "F32", "float32", [], 4, 161),
]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def write(out):
    buffers, specs = [], {}
    for name, _, ref_dtype, shape, size, seed in SAMPLE:
        n = numel(shape) * size
        buf = ctypes.create_string_buffer(bytes((seed + i) % 256 for i in range(n)), max(n, 1))
        buffers.append(buf)  # keeps the memory alive through serialize_file
        specs[name] = TensorSpec(dtype=ref_dtype, shape=shape, data_ptr=ctypes.addressof(buf), data_len=n)
    serialize_file(specs, out)


def listing(path):
    with open(path, "rb") as f:
        tensors = deserialize(f.read())
    with safe_open(path, framework="numpy") as f:
        metadata = f.metadata() or {}
    lines = [f"__metadata__ {k}={metadata[k]}" for k in sorted(metadata)]
    for name, info in sorted(tensors, key=lambda t: t[0]):
        shape = ",".join(str(d) for d in info["shape"])
        data = bytes(info["data"]).hex() or "-"
        lines.append(f"{name} {info['dtype']} [{shape}] {data}")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "list"):
        print(__doc__, file=sys.stderr)
        return 2
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        sys.stdout.write(listing(sys.argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
