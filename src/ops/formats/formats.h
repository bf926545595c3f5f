// Scalar number formats used by DeepSeek-V4.1 checkpoints, activations and KV caches (spec §2).
//
//   bf16   1-8-7  IEEE-like, f32 -> bf16 rounds to nearest, ties to even (RNE); NaN stays a quiet NaN
//   f16    1-5-10 IEEE binary16, RNE, overflow -> inf
//   E4M3   OCP "E4M3FN": bias 7, no infinities, 0x7F/0xFF are NaN, max finite 448, subnormals 2^-9 steps.
//          Encoding is RNE with *satfinite* (|x| > 448 saturates to ±448, as the CUDA cvt.satfinite
//          the reference kernels use); NaN encodes to 0x7F (sign kept: 0xFF for negative NaN).
//   E8M0   unsigned exponent-only scale: value = 2^(b-127), b in 0..254; 0xFF is NaN.
//   E2M1   FP4: sign bit 3, magnitude code 0..7 -> {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Encoding is RNE on the
//          value grid with the spec §2.2 tie rule (see f32_to_e2m1); inputs beyond ±6 saturate.
//   FP4 x2 two E2M1 codes per byte, element 2i in the LOW nibble, element 2i+1 in the high nibble.
//
// All decoders are exact (every code maps to an f32 value without rounding). Hot loops decode through
// the 256-entry tables returned by e4m3_table() / fp4_pair_table(); the per-value functions below are the
// plain definitions the tables are built from and tested against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace cedar::ops {

// ---- bf16 ---------------------------------------------------------------------------------------

// f32 -> bf16 bits, round to nearest even. NaN -> quiet NaN with the same sign (0x7FC0 / 0xFFC0 plus
// the top payload bits); ±inf stays ±inf; values above the bf16 max round to inf as IEEE RNE does.
inline uint16_t f32_to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;  // RNE: add half minus one, plus the lsb so an exact tie rounds to even
  return static_cast<uint16_t>(u >> 16);
}

// bf16 bits -> f32 (exact: bf16 is the top half of an f32).
inline float bf16_bits_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Rounds an f32 to the nearest bf16 value and returns it as f32 (the activation convention of cedar:
// "bf16 tensors" are float arrays holding bf16-representable values).
inline float round_bf16(float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); }

// In-place round_bf16 over a span (plain loop the compiler vectorises; same bits as round_bf16).
void round_bf16_inplace(std::span<float> x);
// Decodes n bf16 values (e.g. an mmapped bf16 tensor row) into floats.
void bf16_to_f32(const uint16_t* src, float* dst, size_t n);
// Encodes n floats into bf16 bits (RNE).
void f32_to_bf16(const float* src, uint16_t* dst, size_t n);
// The same into / out of a byte buffer (2n bytes, little-endian bf16, any alignment): the entries of
// the experimental bf16 KV (model/sequence_state.h KvDtype::kBf16).
void f32_to_bf16_bytes(const float* src, uint8_t* dst, size_t n);
void bf16_bytes_to_f32(const uint8_t* src, float* dst, size_t n);

// ---- f16 ----------------------------------------------------------------------------------------

// f32 -> IEEE binary16 bits, RNE (subnormals included), overflow -> ±inf, NaN -> quiet NaN (sign kept).
uint16_t f32_to_f16_bits(float x);
// binary16 bits -> f32 (exact).
float f16_bits_to_f32(uint16_t h);

// ---- FP8 E4M3 (OCP E4M3FN) ---------------------------------------------------------------------

inline constexpr float kE4M3Max = 448.0f;

// f32 -> E4M3FN code, RNE, satfinite: |x| >= 448 (and ±inf) -> ±448 (0x7E / 0xFE); NaN -> 0x7F|sign.
// Values below half the smallest subnormal (2^-10) round to ±0 (sign kept).
uint8_t f32_to_e4m3(float x);
// E4M3FN code -> f32 (exact). 0x7F and 0xFF decode to NaN.
float e4m3_to_f32(uint8_t code);
// 256-entry decode table (table[c] == e4m3_to_f32(c), NaN entries included). Static storage.
const float* e4m3_table();
// The bf16 bits of the E4M3 value of each 7-bit magnitude code, split into a high-byte and a low-byte
// table for byte-permute decoders (AVX512-VBMI `vpermi2b`; the sign is ORed in separately). E4M3's
// value is exactly a bf16 value, so the bits are the top half of its f32 bits; 0x7F (NaN) gives a
// bf16 NaN. Static storage, 64-byte aligned.
struct E4m3Bf16Bytes {
  alignas(64) uint8_t high[128];
  alignas(64) uint8_t low[128];
};
const E4m3Bf16Bytes& e4m3_bf16_bytes();

// ---- E8M0 scales --------------------------------------------------------------------------------

// 2^(b-127) for b in 0..254 (b = 0 gives the f32 subnormal 2^-127); 0xFF gives NaN.
float e8m0_to_f32(uint8_t b);
// Encodes a power of two s = 2^e, e in [-127, 127], as e + 127. CEDAR_CHECKs that s is exactly such a
// power of two (callers pass scales produced by pow2_round_up_scale(), which always are).
uint8_t e8m0_from_pow2(float s);
// 256-entry decode table (table[b] == e8m0_to_f32(b)). Static storage.
const float* e8m0_table();

// ---- FP4 E2M1 -----------------------------------------------------------------------------------

inline constexpr float kE2M1Max = 6.0f;

// f32 -> 4-bit E2M1 code (bit 3 = sign, from signbit(x), so -0.0 and tiny negatives give 0x8).
// Magnitude rounding (spec §2.2): boundaries 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0 between the grid
// values 0, 0.5, 1, 1.5, 2, 3, 4, 6; strictly above a boundary rounds up; exactly ON a boundary rounds
// up only at 0.75, 1.75 and 3.5 (ties to the even code: 1.0, 2.0, 4.0), down at 0.25, 1.25, 2.5, 5.0.
// |x| > 6 saturates to 6. NaN compares false against every boundary and encodes as a signed zero
// (as the reference's comparison-count encoder does).
uint8_t f32_to_e2m1(float x);
// 4-bit code (0..15, upper bits ignored) -> f32 (exact), e.g. 0xF -> -6.0, 0x8 -> -0.0.
float e2m1_to_f32(uint8_t code);
// 16-entry decode table (table[c] == e2m1_to_f32(c)). Static storage.
const float* e2m1_table();
// The bf16 bits of each code's value (exact: every E2M1 value is a bf16 number), which the x86
// kernels' lookup tables are built from.
inline constexpr uint16_t kE2m1Bf16Bits[16] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
                                               0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};
// The same bits for every 5-bit index c (code c & 15): a `vpermw` table, which reads the low 5 bits
// of each word, so that the bit above a nibble (the next nibble's lowest) does not matter.
struct alignas(64) E2m1Bf16Words {
  uint16_t bits[32];
};
inline constexpr E2m1Bf16Words kE2m1Bf16Words = [] {
  E2m1Bf16Words t{};
  for (size_t c = 0; c < 32; ++c) t.bits[c] = kE2m1Bf16Bits[c % 16];
  return t;
}();

// ---- FP4 pair packing ---------------------------------------------------------------------------

// One byte from two codes: the even-index element in the low nibble.
inline uint8_t pack_fp4_pair(uint8_t even_code, uint8_t odd_code) {
  return static_cast<uint8_t>((even_code & 0x0F) | ((odd_code & 0x0F) << 4));
}
inline uint8_t fp4_low_code(uint8_t byte) { return byte & 0x0F; }  // element 2i
inline uint8_t fp4_high_code(uint8_t byte) { return byte >> 4; }   // element 2i+1

// codes[n] (one 4-bit code per byte, n even) -> packed[n/2].
void pack_fp4(const uint8_t* codes, size_t n, uint8_t* packed);
// packed[n/2] -> codes[n].
void unpack_fp4_codes(const uint8_t* packed, size_t n, uint8_t* codes);
// packed[n/2] -> values[n] (f32, exact E2M1 values, no scale applied).
void unpack_fp4_values(const uint8_t* packed, size_t n, float* values);
// 256-entry table of decoded pairs: fp4_pair_table()[2*b] = value of the low nibble of byte b,
// [2*b+1] = value of the high nibble. Static storage.
const float* fp4_pair_table();

}  // namespace cedar::ops
