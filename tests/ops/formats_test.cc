// Number formats against their mathematical definitions (exhaustive where the code space is small),
// hand-worked tie cases, and the compiler's own _Float16 conversion as an independent f16 oracle.
#include "ops/formats/formats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops_test_util.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h

// E4M3FN from the OCP spec, in double: (-1)^s * 2^(e-7) * (1 + m/8), subnormal 2^-6 * m/8.
double e4m3_math(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

TEST(FormatsE4M3, DecodeMatchesDefinitionForAll256Codes) {
  int nan_count = 0;
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_math(c);
    const float got = e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(e4m3_table()[c] == got || (std::isnan(got) && std::isnan(e4m3_table()[c])), true);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      ++nan_count;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
    }
  }
  EXPECT_EQ(nan_count, 2);  // 0x7F and 0xFF only
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);
}

TEST(FormatsE4M3, EncodeRoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c) << c;
  }
}

TEST(FormatsE4M3, EncodeMidpointsTieToEvenAndNeighboursRoundToNearest) {
  // Every pair of adjacent non-negative codes: the exact midpoint goes to the even code, one f32 ulp
  // either side goes to the nearer code.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_to_f32(static_cast<uint8_t>(c));
    const float hi = e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact in f32
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(lo) + hi) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(f32_to_e4m3(mid), even) << "mid of " << c;
    EXPECT_EQ(f32_to_e4m3(-mid), even | 0x80) << "neg mid of " << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), c) << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1e9f)), c + 1) << c;
  }
}

TEST(FormatsE4M3, SaturatesAndKeepsNaN) {
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);  // would be a tie to 512 (NaN) without satfinite
  EXPECT_EQ(f32_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(f32_to_e4m3(0x1p-11f), 0x00);  // below half the smallest subnormal
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);  // exact half of 2^-9: tie to even (0)
  EXPECT_EQ(f32_to_e4m3(0x3p-10f), 0x02);  // 1.5 * 2^-9: tie between codes 1 and 2 -> 2
  EXPECT_EQ(f32_to_e4m3(0x3p-11f), 0x01);  // 0.75 * 2^-9: nearest is 2^-9
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
}

TEST(FormatsE8M0, DecodeAll256) {
  for (int b = 0; b < 256; ++b) {
    const float got = e8m0_to_f32(static_cast<uint8_t>(b));
    if (b == 255) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), std::ldexp(1.0, b - 127)) << b;
    EXPECT_EQ(e8m0_table()[b], got);
    EXPECT_EQ(e8m0_from_pow2(got), b) << b;
  }
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), 0x1p-127f);  // an f32 subnormal
}

TEST(FormatsE2M1, DecodeAll16) {
  const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    // E2M1: exponent bias 1, 1 mantissa bit; exponent 0 = subnormal 0.5*m.
    const int e = (c >> 1) & 3, m = c & 1;
    const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + m / 2.0, e - 1);
    EXPECT_EQ(mag, grid[c & 7]);
    EXPECT_EQ(static_cast<double>(e2m1_to_f32(static_cast<uint8_t>(c))), (c & 8) ? -mag : mag) << c;
    EXPECT_EQ(std::signbit(e2m1_to_f32(static_cast<uint8_t>(c))), (c & 8) != 0);
    EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(static_cast<uint8_t>(c))), c) << c;
    // The bf16 bits the x86 kernels' tables are built from: the value exactly, sign included.
    const float value = e2m1_to_f32(static_cast<uint8_t>(c));
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    EXPECT_EQ(bits & 0xFFFFu, 0u) << c;
    EXPECT_EQ(kE2m1Bf16Bits[c], bits >> 16) << c;
  }
}

TEST(FormatsE2M1, TieRulesOfSpec22) {
  // Boundaries: 0.25 down, 0.75 up, 1.25 down, 1.75 up, 2.5 down, 3.5 up, 5.0 down.
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);
  EXPECT_EQ(f32_to_e2m1(0.75f), 2);
  EXPECT_EQ(f32_to_e2m1(1.25f), 2);
  EXPECT_EQ(f32_to_e2m1(1.75f), 4);
  EXPECT_EQ(f32_to_e2m1(2.5f), 4);
  EXPECT_EQ(f32_to_e2m1(3.5f), 6);
  EXPECT_EQ(f32_to_e2m1(5.0f), 6);
  EXPECT_EQ(f32_to_e2m1(-5.0f), 0xE);
  EXPECT_EQ(f32_to_e2m1(-0.75f), 0xA);
  // Just past each boundary rounds up; just below rounds down.
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(f32_to_e2m1(std::nextafter(mids[i], 10.0f)), i + 1) << mids[i];
    EXPECT_EQ(f32_to_e2m1(std::nextafter(mids[i], 0.0f)), i) << mids[i];
  }
  EXPECT_EQ(f32_to_e2m1(100.0f), 7);  // saturates to 6
  EXPECT_EQ(f32_to_e2m1(-100.0f), 0xF);
  EXPECT_EQ(f32_to_e2m1(-0.0f), 0x8);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 0x8);
}

TEST(FormatsFp4Pack, EvenElementInLowNibble) {
  EXPECT_EQ(pack_fp4_pair(0x1, 0xF), 0xF1);
  const uint8_t codes[6] = {0x2, 0x7, 0x8, 0x0, 0xF, 0x1};
  uint8_t packed[3];
  pack_fp4(codes, 6, packed);
  EXPECT_EQ(packed[0], 0x72);
  EXPECT_EQ(packed[1], 0x08);
  EXPECT_EQ(packed[2], 0x1F);
  uint8_t back[6];
  unpack_fp4_codes(packed, 6, back);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back[i], codes[i]);
  float values[6];
  unpack_fp4_values(packed, 6, values);
  const float want[6] = {1.0f, 6.0f, -0.0f, 0.0f, -6.0f, 0.5f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(bits_of(values[i]), bits_of(want[i])) << i;
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(fp4_pair_table()[2 * b], e2m1_to_f32(static_cast<uint8_t>(b & 0xF)));
    EXPECT_EQ(fp4_pair_table()[2 * b + 1], e2m1_to_f32(static_cast<uint8_t>(b >> 4)));
  }
}

TEST(FormatsBf16, RoundToNearestEvenOnCraftedBits) {
  // Low 16 bits below / at / above half, with an even and an odd kept lsb.
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3F807FFFu)), 0x3F80);  // below half: down
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3F808000u)), 0x3F80);  // tie, even lsb: stays
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3F818000u)), 0x3F82);  // tie, odd lsb: up to even
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3F808001u)), 0x3F81);  // above half: up
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x3FFF8000u)), 0x4000);  // carry into the exponent
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x7F7FFFFFu)), 0x7F80);  // max f32 rounds to inf
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x00008000u)), 0x0000);  // subnormal tie to even 0
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x80018000u)), 0x8002);
  EXPECT_EQ(f32_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  // NaN stays NaN, quiet, sign kept, even when rounding would carry the payload into inf.
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0xFFFFFFFFu)), 0xFFFF);
  EXPECT_EQ(f32_to_bf16_bits(from_bits(0x7F80FFFFu)) & 0x7FC0, 0x7FC0);
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float v = bf16_bits_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(v)) continue;
    EXPECT_EQ(f32_to_bf16_bits(v), b);
  }
}

TEST(FormatsBf16, MatchesNearestByExhaustiveNeighbourSearch) {
  // Definition: the bf16 value nearest in real arithmetic (ties to the even mantissa).
  Rng rng(7);
  UniformInt<uint32_t> dist(0, 0x7F7FFFFFu);
  for (int i = 0; i < 20000; ++i) {
    const float x = from_bits(dist(rng) | ((i & 1) ? 0x80000000u : 0u));
    const uint16_t lo = static_cast<uint16_t>(bits_of(x) >> 16);  // truncation (toward zero)
    const uint16_t hi = static_cast<uint16_t>(lo + 1);
    const double dl = std::fabs(static_cast<double>(x) - bf16_bits_to_f32(lo));
    const double dh = std::fabs(static_cast<double>(bf16_bits_to_f32(hi)) - x);
    const uint16_t want = dl < dh ? lo : (dh < dl ? hi : ((lo & 1) ? hi : lo));
    ASSERT_EQ(f32_to_bf16_bits(x), want) << std::hexfloat << x;
  }
  std::vector<float> v = {1.00390625f, 3.0f, -2.5f};
  round_bf16_inplace(v);
  EXPECT_EQ(v[0], 1.0f);  // 1 + 2^-8 is a tie -> even (1.0)
}

TEST(FormatsF16, AgreesWithCompilerFloat16OnAllCodesAndRandomFloats) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t hb = static_cast<uint16_t>(h);
    _Float16 ref;
    std::memcpy(&ref, &hb, 2);
    const float want = static_cast<float>(ref);
    const float got = f16_bits_to_f32(hb);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got));
      continue;
    }
    ASSERT_EQ(bits_of(got), bits_of(want)) << h;
    ASSERT_EQ(f32_to_f16_bits(got), hb) << h;
  }
  Rng rng(11);
  UniformInt<uint32_t> dist(0x30000000u, 0x48000000u);  // f16 range and beyond
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(dist(rng) | ((i & 1) ? 0x80000000u : 0u));
    const _Float16 ref = static_cast<_Float16>(x);
    uint16_t want;
    std::memcpy(&want, &ref, 2);
    ASSERT_EQ(f32_to_f16_bits(x), want) << std::hexfloat << x;
  }
}

}  // namespace
}  // namespace cedar::ops
