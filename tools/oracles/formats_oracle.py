#!/usr/bin/env python3
"""Independent oracle for cedar's number formats and block quantisers (src/ops/formats/formats.h, quant.h).

Uses ml_dtypes (bfloat16, float8_e4m3fn, float8_e8m0fnu, float4_e2m1fn) and numpy float16 for every
conversion, and re-implements the reference block quantisers (kernel.py act_quant / fp4_act_quant,
spec sections 2.1-2.2) in numpy on top of them. Writes tests/ops/data/formats_oracle.txt, which the C++
test formats_oracle_test.cc replays. Versions are pinned in tools/oracles/requirements.txt.

  .venv-oracles/bin/python tools/oracles/formats_oracle.py
"""
import pathlib

import ml_dtypes
import numpy as np

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "ops" / "data" / "formats_oracle.txt"
F32 = np.float32


def bits32(a):
    return np.asarray(a, dtype=F32).view(np.uint32)


def conversion_inputs(rng):
    vals = [0.0, -0.0, 1.0, -1.0, 448.0, 449.0, 464.0, 480.0, 1e30, -1e30, 6.0, 7.0, 5.0, 3.5, 2.5,
            1.75, 1.25, 0.75, 0.25, 2.0**-9, 2.0**-10, 1.5 * 2.0**-9, 2.0**-6, 65504.0, 65520.0, 65536.0,
            2.0**-24, 2.0**-25, 3 * 2.0**-26, 1e-8, np.inf, -np.inf]
    x = list(np.array(vals, dtype=F32))
    # Exact midpoints between adjacent E4M3 values and between adjacent bf16 values near 1.
    e4 = np.arange(0, 127, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(F32)
    x += list(((e4[:-1].astype(np.float64) + e4[1:]) / 2).astype(F32))
    x += list(F32(1.0) + F32(2.0**-8) * np.arange(0, 16, dtype=F32))  # bf16 ties and halfway points
    # Random f32 over a wide exponent range, plus bf16-valued randoms.
    x += list((rng.standard_normal(1500) * np.exp2(rng.uniform(-30, 20, 1500))).astype(F32))
    x += list(np.asarray(rng.standard_normal(500) * 8, dtype=F32).astype(ml_dtypes.bfloat16).astype(F32))
    xs = np.array(x, dtype=F32)
    return np.concatenate([xs, -xs])


def pow2_round_up(amax, max_inv):
    y = (amax.astype(F32) * F32(max_inv)).astype(F32)
    b = y.view(np.int32)
    exp = (b >> 23) & 0xFF
    man = b & ((1 << 23) - 1)
    log2c = exp - 127 + (man != 0).astype(np.int32)
    return ((log2c + 127) << 23).astype(np.int32).view(F32)


def fp8_block(x):
    amax = np.maximum(np.abs(x).max(), F32(1e-4)).astype(F32)
    s = pow2_round_up(np.array([amax]), 1.0 / 448.0)[0]
    q = np.clip((x / s).astype(F32), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return q.view(np.uint8), np.array([s], F32).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)[0]


def fp4_e8m0_block(x):
    amax = np.maximum(np.abs(x).max(), F32(6 * 2.0**-126)).astype(F32)
    s = pow2_round_up(np.array([amax]), 1.0 / 6.0)[0]
    q = np.clip((x / s).astype(F32), -6, 6).astype(ml_dtypes.float4_e2m1fn)
    return q.view(np.uint8) & 0xF, np.array([s], F32).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)[0]


def fp4_e4m3_block(x):
    amax = np.maximum(np.abs(x).max(), F32(6 * 2.0**-9)).astype(F32)
    s8 = np.clip(np.array([amax / F32(6.0)], F32), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    s = s8.astype(F32)[0]
    q = np.clip((x / s).astype(F32), -6, 6).astype(ml_dtypes.float4_e2m1fn)
    return q.view(np.uint8) & 0xF, s8.view(np.uint8)[0]


def hexs(a, width):
    return " ".join(f"{int(v):0{width}x}" for v in a)


def main():
    rng = np.random.default_rng(20261202)
    lines = [f"# cedar formats oracle: ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}"]
    xs = conversion_inputs(rng)
    bf = xs.astype(ml_dtypes.bfloat16).view(np.uint16)
    with np.errstate(over="ignore"):  # values beyond 65504 become inf, as intended
        f16 = xs.astype(np.float16).view(np.uint16)
    # The reference saturates before the FP8/FP4 casts (satfinite); NaN inputs are not generated.
    e4 = np.clip(xs, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    e2 = np.clip(xs, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    for i in range(len(xs)):
        lines.append(f"cvt {bits32(xs[i]):08x} {bf[i]:04x} {f16[i]:04x} {e4[i]:02x} {e2[i]:x}")
    for code in range(255):
        v = np.array([code], np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(F32)[0]
        lines.append(f"e8m0 {code:02x} {bits32(v):08x}")
    for _ in range(60):
        x = (rng.standard_normal(32) * np.exp2(rng.uniform(-12, 12))).astype(F32)
        x = x.astype(ml_dtypes.bfloat16).astype(F32)
        if rng.uniform() < 0.1:
            x[:] = 0
        codes, sc = fp8_block(x)
        lines.append(f"fp8 {hexs(bits32(x), 8)} | {hexs(codes, 2)} | {sc:02x}")
        codes, sc = fp4_e8m0_block(x)
        lines.append(f"fp4e8m0 {hexs(bits32(x), 8)} | {hexs(codes, 1)} | {sc:02x}")
        codes, sc = fp4_e4m3_block(x[:16])
        lines.append(f"fp4e4m3 {hexs(bits32(x[:16]), 8)} | {hexs(codes, 1)} | {sc:02x}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT} ({len(lines)} lines)")


if __name__ == "__main__":
    main()
