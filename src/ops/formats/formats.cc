// Scalar definitions of the number formats (formats.h) and their decode tables.
#include "ops/formats/formats.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"

namespace cedar::ops {
namespace {

float f32_from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
uint32_t bits_from_f32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// E4M3FN value of a code straight from the definition: sign, 4-bit exponent (bias 7), 3-bit mantissa,
// exponent 0 = subnormal (m * 2^-9), code 0x7F/0xFF = NaN, no infinities.
float e4m3_definition(uint8_t code) {
  const int sign = code >> 7;
  const int exp = (code >> 3) & 0xF;
  const int man = code & 0x7;
  if (exp == 0xF && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                             : std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return sign ? -mag : mag;
}

struct Tables {
  std::array<float, 256> e4m3;
  std::array<float, 256> e8m0;
  std::array<float, 16> e2m1;
  std::array<float, 512> fp4_pairs;
  Tables() {
    for (int c = 0; c < 256; ++c) e4m3[c] = e4m3_definition(static_cast<uint8_t>(c));
    for (int b = 0; b < 256; ++b)
      e8m0[b] = b == 255 ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, b - 127);
    static constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int c = 0; c < 16; ++c) e2m1[c] = (c & 8) ? -kGrid[c & 7] : kGrid[c & 7];
    for (int b = 0; b < 256; ++b) {
      fp4_pairs[2 * b] = e2m1[b & 0xF];
      fp4_pairs[2 * b + 1] = e2m1[b >> 4];
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

// ---- f16 ----

uint16_t f32_to_f16_bits(float x) {
  const uint32_t u = bits_from_f32(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));  // qNaN
  if (abs >= 0x47800000u) {  // >= 65536: rounds to inf in any case
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  const int exp = static_cast<int>(abs >> 23) - 127;
  if (exp >= -14) {  // normal f16 range (may round up into the next binade or to inf)
    uint32_t mant = abs & 0x7FFFFFu;
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1FFFu;                     // the 13 dropped bits
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carries into the exponent correctly
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal f16: value = q * 2^-24, q = RNE(|x| / 2^-24). |x| < 2^-14 so q <= 1024 (1024 = min normal).
  const float q = std::nearbyint(std::ldexp(f32_from_bits(abs), 24));  // exact scaling, RNE rounding
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
}

float f16_bits_to_f32(uint16_t h) {
  const int sign = h >> 15;
  const int exp = (h >> 10) & 0x1F;
  const int man = h & 0x3FF;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 0x1F) {
    if (man != 0) {
      const uint32_t u =
          (static_cast<uint32_t>(sign) << 31) | 0x7FC00000u | (static_cast<uint32_t>(man) << 13);
      return f32_from_bits(u);
    }
    mag = std::numeric_limits<float>::infinity();
  } else {
    mag = std::ldexp(1.0f + static_cast<float>(man) / 1024.0f, exp - 15);
  }
  return sign ? -mag : mag;
}

// ---- bulk bf16 (scalar; the loops are simple enough for the compiler to vectorise) ----

void round_bf16_inplace(std::span<float> x) {
  for (float& v : x) v = round_bf16(v);
}
void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_f32(src[i]);
}
void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16_bits(src[i]);
}
void f32_to_bf16_bytes(const float* src, uint8_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t b = f32_to_bf16_bits(src[i]);
    dst[2 * i] = static_cast<uint8_t>(b & 0xFF);
    dst[2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
}
void bf16_bytes_to_f32(const uint8_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] = bf16_bits_to_f32(static_cast<uint16_t>(src[2 * i] | (static_cast<uint16_t>(src[2 * i + 1]) << 8)));
}

// ---- E4M3 ----

uint8_t f32_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7F);
  const float a = std::fabs(x);
  if (a >= kE4M3Max) return static_cast<uint8_t>(sign | 0x7E);  // satfinite (inf included)
  if (a < 0x1p-6f) {
    // Subnormal (or zero): a multiple of 2^-9; q = RNE(a * 2^9) in 0..8, 8 is the smallest normal
    // whose code (exponent 1, mantissa 0) is also 8, so the code is q itself.
    const float q = std::nearbyint(a * 512.0f);  // a*512 is exact (power-of-two scaling)
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));
  }
  int e2;
  const float frac = std::frexp(a, &e2);                  // a = frac * 2^e2, frac in [0.5, 1)
  int exp = e2 - 1;                                       // a = (2*frac) * 2^exp, 2*frac in [1, 2)
  float m = std::nearbyint((2.0f * frac - 1.0f) * 8.0f);  // exact product, RNE to 3 bits
  if (m == 8.0f) {                                        // rounded up into the next binade
    m = 0.0f;
    ++exp;
  }
  // a < 448 and 448 is representable, so the rounded value never exceeds 448 (code 0x7E).
  return static_cast<uint8_t>(sign | ((exp + 7) << 3) | static_cast<int>(m));
}

float e4m3_to_f32(uint8_t code) { return tables().e4m3[code]; }
const float* e4m3_table() { return tables().e4m3.data(); }

const E4m3Bf16Bytes& e4m3_bf16_bytes() {
  static const E4m3Bf16Bytes bytes = [] {
    E4m3Bf16Bytes b{};
    const float* values = e4m3_table();
    for (int c = 0; c < 128; ++c) {
      uint32_t bits;
      std::memcpy(&bits, &values[c], 4);
      b.high[c] = static_cast<uint8_t>(bits >> 24);
      b.low[c] = static_cast<uint8_t>(bits >> 16);
    }
    return b;
  }();
  return bytes;
}

// ---- E8M0 ----

float e8m0_to_f32(uint8_t b) { return tables().e8m0[b]; }
const float* e8m0_table() { return tables().e8m0.data(); }

uint8_t e8m0_from_pow2(float s) {
  int e2;
  const float frac = std::frexp(s, &e2);
  CEDAR_CHECK(frac == 0.5f && e2 - 1 >= -127 && e2 - 1 <= 127,
              "E8M0 scale %g is not a power of two in [2^-127, 2^127]", static_cast<double>(s));
  return static_cast<uint8_t>(e2 - 1 + 127);
}

// ---- E2M1 ----

uint8_t f32_to_e2m1(float x) {
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  // Boundaries between consecutive grid values; an exact tie goes up only where the upper code is
  // even (0.75 -> 1.0 code 2, 1.75 -> 2.0 code 4, 3.5 -> 4.0 code 6).
  static constexpr float kMids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  static constexpr bool kTieUp[7] = {false, true, false, true, false, true, false};
  uint8_t code = 0;
  for (int i = 0; i < 7; ++i) {
    if (a > kMids[i] || (a == kMids[i] && kTieUp[i])) code = static_cast<uint8_t>(i + 1);
  }
  return static_cast<uint8_t>(sign | code);
}

float e2m1_to_f32(uint8_t code) { return tables().e2m1[code & 0xF]; }
const float* e2m1_table() { return tables().e2m1.data(); }

// ---- FP4 pairs ----

void pack_fp4(const uint8_t* codes, size_t n, uint8_t* packed) {
  CEDAR_CHECK(n % 2 == 0, "pack_fp4 needs an even count, got %zu", n);
  for (size_t i = 0; i < n / 2; ++i) packed[i] = pack_fp4_pair(codes[2 * i], codes[2 * i + 1]);
}
void unpack_fp4_codes(const uint8_t* packed, size_t n, uint8_t* codes) {
  CEDAR_CHECK(n % 2 == 0, "unpack_fp4 needs an even count, got %zu", n);
  for (size_t i = 0; i < n / 2; ++i) {
    codes[2 * i] = fp4_low_code(packed[i]);
    codes[2 * i + 1] = fp4_high_code(packed[i]);
  }
}
void unpack_fp4_values(const uint8_t* packed, size_t n, float* values) {
  CEDAR_CHECK(n % 2 == 0, "unpack_fp4 needs an even count, got %zu", n);
  const float* pairs = fp4_pair_table();
  for (size_t i = 0; i < n / 2; ++i) {
    values[2 * i] = pairs[2 * packed[i]];
    values[2 * i + 1] = pairs[2 * packed[i] + 1];
  }
}
const float* fp4_pair_table() { return tables().fp4_pairs.data(); }

}  // namespace cedar::ops
