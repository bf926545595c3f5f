// Block quantisers: hand-worked cases, properties (idempotence, error bounds, scale rules) and the
// packed KV entry formats.
#include "ops/formats/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/formats/formats.h"
#include "ops_test_util.h"
#include "simd_targets.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h and simd_targets.h

// bf16 values spread over 2 * spread_log2 binades: a normal times 2^uniform(-spread_log2, spread_log2).
std::vector<float> random_wide_bf16(size_t n, uint32_t seed, float spread_log2 = 6.0f) {
  Rng rng(seed);
  Normal normal(0.0f, 1.0f);
  UniformReal expo(-spread_log2, spread_log2);
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(normal(rng) * std::exp2(expo(rng)));
  return v;
}

TEST(Pow2Scale, CeilLog2ByExponentBits) {
  const float inv448 = static_cast<float>(1.0 / 448.0);
  EXPECT_EQ(pow2_round_up_scale(448.0f, inv448), 1.0f);  // 448 * fp32(1/448) rounds to exactly 1
  EXPECT_EQ(pow2_round_up_scale(449.0f, inv448), 2.0f);
  EXPECT_EQ(pow2_round_up_scale(224.0f, inv448), 0.5f);
  EXPECT_EQ(pow2_round_up_scale(1.0f, 1.0f), 1.0f);
  EXPECT_EQ(pow2_round_up_scale(1.5f, 1.0f), 2.0f);
  EXPECT_EQ(pow2_round_up_scale(0.75f, 1.0f), 1.0f);
  EXPECT_EQ(pow2_round_up_scale(0x1p-20f, 1.0f), 0x1p-20f);
  // The 1e-4 floor: 1e-4 / 448 = 2.23e-7 -> 2^-22.
  EXPECT_EQ(pow2_round_up_scale(kFp8AmaxFloor, inv448), 0x1p-22f);
}

TEST(ActQuantFp8, HandWorkedBlock) {
  // amax = 3.5 -> 3.5 * fp32(1/448) = 0.0078125 = 2^-7 exactly? 3.5/448 = 1/128: scale 2^-7.
  std::vector<float> x(32, 0.0f);
  x[0] = 3.5f;
  x[1] = -1.0f;
  x[2] = 0.01171875f;  // 1.5 * 2^-7 -> q = 1.5
  x[3] = 1.0f / 3.0f;  // not bf16, but act_quant only needs finite input: q = 42.67 -> 40 or 44?
  std::vector<uint8_t> codes(32), scales(1);
  act_quant_fp8(x.data(), 32, codes.data(), scales.data());
  EXPECT_EQ(scales[0], 127 - 7);
  EXPECT_EQ(e4m3_to_f32(codes[0]), 448.0f);
  EXPECT_EQ(e4m3_to_f32(codes[1]), -128.0f);
  EXPECT_EQ(e4m3_to_f32(codes[2]), 1.5f);
  // (1/3) * 128 = 42.666..; E4M3 grid in [32, 64) has step 4: 40, 44 -> nearest 44.
  EXPECT_EQ(e4m3_to_f32(codes[3]), 44.0f);
  EXPECT_EQ(codes[4], 0);
}

TEST(ActQuantFp8, AllZeroBlockUsesTheFloor) {
  std::vector<float> x(64, 0.0f);
  x[40] = 1e-6f;  // second block amax below the floor as well
  std::vector<uint8_t> codes(64), scales(2);
  act_quant_fp8(x.data(), 64, codes.data(), scales.data());
  EXPECT_EQ(e8m0_to_f32(scales[0]), 0x1p-22f);
  EXPECT_EQ(e8m0_to_f32(scales[1]), 0x1p-22f);
  // 1e-6 / 2^-22 = 4.19 -> E4M3 4.0
  EXPECT_EQ(e4m3_to_f32(codes[40]), 4.0f);
}

TEST(ActQuantFp8, QdqIsIdempotentBoundedAndBf16Exact) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    auto x = random_wide_bf16(32 * 16, seed, 10.0f);
    auto y = x;
    act_qdq_fp8_inplace(y.data(), y.size());
    std::vector<uint8_t> codes(x.size()), sc(x.size() / 32);
    std::vector<float> scf(x.size() / 32);
    act_quant_fp8(x.data(), x.size(), codes.data(), sc.data());
    act_quant_fp8_f32_scales(x.data(), x.size(), codes.data(), scf.data());
    for (size_t b = 0; b < x.size() / 32; ++b) {
      const float s = e8m0_to_f32(sc[b]);
      ASSERT_EQ(s, scf[b]);
      float amax = 0;
      for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
      // s is the smallest power of two with amax / s <= 448 (amax above the floor).
      if (amax > 1e-3f) {
        EXPECT_LE(amax / s, 448.0f);
        EXPECT_GT(amax / s, 224.0f * (1.0f - 1e-6f));
      }
      for (size_t i = 0; i < 32; ++i) {
        const float v = x[b * 32 + i];
        const float q = y[b * 32 + i];
        ASSERT_EQ(round_bf16(q), q);  // the QDQ product is bf16-exact
        ASSERT_EQ(q, e4m3_to_f32(codes[b * 32 + i]) * s);
        // Error <= half an E4M3 step at |v|/s (subnormal step 2^-9), times s.
        const float vs = std::fabs(v) / s;
        const float step = vs < 0x1p-6f ? 0x1p-9f : std::exp2(std::floor(std::log2(vs)) - 3);
        ASSERT_LE(std::fabs(v - q), 0.5f * step * s * (1 + 1e-6f)) << v << " " << q;
      }
    }
    auto z = y;
    act_qdq_fp8_inplace(z.data(), z.size());
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits_of(z[i]), bits_of(y[i])) << i;
  }
}

TEST(Fp4QuantE8M0, HandWorked) {
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;   // amax 6 -> 6 * fp32(1/6) = 1.0000000298 -> rounds to 1.0 in f32 -> s = 1
  x[1] = 0.75f;  // tie -> 1.0
  x[2] = -2.5f;  // tie -> 2.0
  x[3] = 5.0f;   // tie -> 4.0
  x[4] = 0.3f;   // -> 0.5
  std::vector<uint8_t> packed(16), sc(1);
  fp4_quant_e8m0(x.data(), 32, packed.data(), sc.data());
  EXPECT_EQ(e8m0_to_f32(sc[0]), 1.0f);
  EXPECT_EQ(packed[0], pack_fp4_pair(0x7, 0x2));
  EXPECT_EQ(packed[1], pack_fp4_pair(0xC, 0x6));
  EXPECT_EQ(packed[2], pack_fp4_pair(0x1, 0x0));
  auto y = x;
  fp4_qdq_e8m0_inplace(y.data(), 32);
  EXPECT_EQ(y[0], 6.0f);
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[2], -2.0f);
  EXPECT_EQ(y[3], 4.0f);
  EXPECT_EQ(y[4], 0.5f);
}

TEST(Fp4QuantE4M3, HandWorkedNonPowerOfTwoScale) {
  std::vector<float> x(16, 0.0f);
  x[0] = 7.5f;   // amax/6 = 1.25 -> E4M3 1.25 (exact) -> x/s = 6
  x[1] = 1.25f;  // -> 1.0
  x[2] = -3.0f;  // -> -2.4 -> -2.0
  std::vector<uint8_t> packed(8), sc(1);
  fp4_quant_e4m3(x.data(), 16, packed.data(), sc.data());
  EXPECT_EQ(e4m3_to_f32(sc[0]), 1.25f);
  auto y = x;
  fp4_qdq_e4m3_inplace(y.data(), 16);
  EXPECT_EQ(y[0], 7.5f);
  EXPECT_EQ(y[1], 1.25f);
  EXPECT_EQ(y[2], -2.5f);
  // All-zero block: scale floor 6*2^-9 / 6 = 2^-9 (smallest E4M3 subnormal).
  std::vector<float> zero(16, 0.0f);
  fp4_quant_e4m3(zero.data(), 16, packed.data(), sc.data());
  EXPECT_EQ(e4m3_to_f32(sc[0]), 0x1p-9f);
}

TEST(Fp4Quant, QdqPropertiesBothVariants) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const auto x = random_wide_bf16(512, 100 + seed, 8.0f);
    for (int variant = 0; variant < 2; ++variant) {
      const size_t block = variant == 0 ? 32 : 16;
      auto y = x;
      if (variant == 0)
        fp4_qdq_e8m0_inplace(y.data(), y.size());
      else
        fp4_qdq_e4m3_inplace(y.data(), y.size());
      for (size_t b = 0; b < x.size() / block; ++b) {
        float amax = 0;
        for (size_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b * block + i]));
        for (size_t i = 0; i < block; ++i) {
          const float v = x[b * block + i], q = y[b * block + i];
          ASSERT_EQ(round_bf16(q), q);
          // Bound: half the widest E2M1 gap (1.0, between 4 and 6) times s, and s <= amax/6 * (1+2^-3)
          // for the E4M3 scale (3 mantissa bits), s < amax/3 for the power-of-two scale; plus clamp
          // error when amax/s > 6 (E4M3 scale rounded down): at most amax - 6s <= amax/16.
          const float s_bound = variant == 0 ? amax / 3.0f : amax / 6.0f * 1.0625f;
          ASSERT_LE(std::fabs(v - q), std::max(1.0f * s_bound, amax / 16.0f) * (1 + 1e-5f) + 1e-30f)
              << "variant " << variant << " v " << v << " q " << q << " amax " << amax;
        }
      }
      auto z = y;
      if (variant == 0)
        fp4_qdq_e8m0_inplace(z.data(), z.size());
      else
        fp4_qdq_e4m3_inplace(z.data(), z.size());
      if (variant == 0) {
        // Power-of-two scale: re-quantising the QDQ output is exact (idempotent).
        for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits_of(z[i]), bits_of(y[i])) << i;
      }
    }
  }
}

TEST(Fp4Quant, E2M1RoundingIsNearestOnTheScaledGrid) {
  // With s = 1 (amax exactly 6), every output is the nearest grid value; compare against a brute
  // force nearest search (ties to the even code).
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  Rng rng(3);
  UniformReal u(-6.0f, 6.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(32);
    for (auto& v : x) v = round_bf16(u(rng));
    x[0] = 6.0f;
    auto y = x;
    fp4_qdq_e8m0_inplace(y.data(), 32);
    for (size_t i = 0; i < 32; ++i) {
      const float a = std::fabs(x[i]);
      int best = 0;
      for (int c = 1; c < 8; ++c) {
        const float dc = std::fabs(a - grid[c]), db = std::fabs(a - grid[best]);
        if (dc < db || (dc == db && c % 2 == 0)) best = c;
      }
      ASSERT_EQ(std::fabs(y[i]), grid[best]) << x[i];
    }
  }
}

TEST(KvEntries, PackUnpackEqualsReferenceQdq) {
  for (uint32_t seed = 0; seed < 10; ++seed) {
    const auto x = random_wide_bf16(512, 200 + seed, 5.0f);
    {  // main KV: FP4 + E4M3 per 16
      std::vector<uint8_t> entry(kMainKvEntryBytes);
      pack_main_kv_entry(x.data(), entry.data());
      std::vector<float> got(512), want = x;
      unpack_main_kv_entry(entry.data(), got.data());
      fp4_qdq_e4m3_inplace(want.data(), 512, 16);
      for (size_t i = 0; i < 512; ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << i;
    }
    {  // window KV: FP8 + E8M0 per 32
      std::vector<uint8_t> entry(kWindowKvEntryBytes);
      pack_window_kv_entry(x.data(), entry.data());
      std::vector<float> got(512), want = x;
      unpack_window_kv_entry(entry.data(), got.data());
      act_qdq_fp8_inplace(want.data(), 512);
      for (size_t i = 0; i < 512; ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << i;
    }
    {  // index key: FP4 + E8M0 per 32
      std::vector<uint8_t> entry(kIndexKeyEntryBytes);
      pack_index_key_entry(x.data(), entry.data());
      std::vector<float> got(128), want(x.begin(), x.begin() + 128);
      unpack_index_key_entry(entry.data(), got.data());
      fp4_qdq_e8m0_inplace(want.data(), 128, 32);
      for (size_t i = 0; i < 128; ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << i;
    }
  }
}

// The window KV's SIMD decoder against the scalar reference: every one of the 256 codes (NaN codes
// included) under every scale byte, block lengths that leave tails for every vector width.
TEST(Fp8Dequant, SimdDecoderEqualsTheReferenceOnEveryTarget) {
  for (size_t block : {size_t{32}, size_t{128}, size_t{7}}) {
    const size_t n = 256 * block;
    std::vector<uint8_t> codes(n), scales(n / block);
    for (size_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>((i * 37 + i / 256) % 256);
    for (size_t b = 0; b < scales.size(); ++b) scales[b] = static_cast<uint8_t>(b);  // 2^-127 .. NaN (0xFF)
    std::vector<float> want(n);
    ref::fp8_dequant_e8m0(codes.data(), scales.data(), n, want.data(), block);
    testing::for_each_simd_target([&] {
      std::vector<float> got(n);
      fp8_dequant_e8m0(codes.data(), scales.data(), n, got.data(), block);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << "block " << block << " i " << i;
    });
  }
  // And the reference itself, from the per-value functions: code value times scale, in f32.
  const uint8_t code[2] = {0x38, 0xB9}, scale[1] = {126};  // 1.0, -1.125; scale 2^-1
  float out[2];
  ref::fp8_dequant_e8m0(code, scale, 2, out, 2);
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], -0.5625f);
}

// The FP4 decoders (compressed KV entries: E4M3 scales per 16; index keys: E8M0 per 32) against the
// scalar references: every packed byte under every scale byte, and odd blocks that leave tails.
TEST(Fp4Dequant, SimdDecodersEqualTheReferencesOnEveryTarget) {
  for (size_t block : {size_t{16}, size_t{32}, size_t{6}, size_t{64}}) {
    const size_t n = 256 * block;
    std::vector<uint8_t> packed(n / 2), scales(n / block);
    for (size_t i = 0; i < n / 2; ++i) packed[i] = static_cast<uint8_t>((i * 37 + i / 256) % 256);
    for (size_t b = 0; b < scales.size(); ++b) scales[b] = static_cast<uint8_t>(b);  // every E4M3 / E8M0 code
    std::vector<float> want4(n), want8(n);
    ref::fp4_dequant_e4m3(packed.data(), scales.data(), n, want4.data(), block);
    ref::fp4_dequant_e8m0(packed.data(), scales.data(), n, want8.data(), block);
    testing::for_each_simd_target([&] {
      std::vector<float> got4(n), got8(n);
      fp4_dequant_e4m3(packed.data(), scales.data(), n, got4.data(), block);
      fp4_dequant_e8m0(packed.data(), scales.data(), n, got8.data(), block);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(bits_of(got4[i]), bits_of(want4[i])) << "E4M3 scales, block " << block << " i " << i;
        ASSERT_EQ(bits_of(got8[i]), bits_of(want8[i])) << "E8M0 scales, block " << block << " i " << i;
      }
    });
  }
  // Every byte's two values, unscaled, from the per-value definition (low nibble first).
  std::vector<uint8_t> bytes(256), one(512 / kFp4E4M3Block, 0x38);  // E4M3 0x38 = 1.0
  for (int b = 0; b < 256; ++b) bytes[b] = static_cast<uint8_t>(b);
  std::vector<float> out(512);
  fp4_dequant_e4m3(bytes.data(), one.data(), 512, out.data());
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(bits_of(out[2 * b]), bits_of(e2m1_to_f32(static_cast<uint8_t>(b & 0xF)))) << b;
    EXPECT_EQ(bits_of(out[2 * b + 1]), bits_of(e2m1_to_f32(static_cast<uint8_t>(b >> 4)))) << b;
  }
}

TEST(KvEntries, LayoutCodesThenScales) {
  std::vector<float> x(512, 0.0f);
  x[0] = 448.0f;  // block 0 scale: 448/448 = 1 -> E8M0 127
  x[33] = 1.0f;   // block 1 scale: 1/448 -> 2^-8 -> E8M0 119
  std::vector<uint8_t> entry(kWindowKvEntryBytes);
  pack_window_kv_entry(x.data(), entry.data());
  EXPECT_EQ(entry[0], 0x7E);
  EXPECT_EQ(entry[512], 127);
  EXPECT_EQ(entry[513], 119);
  EXPECT_EQ(e4m3_to_f32(entry[33]), 256.0f);
  EXPECT_EQ(kMainKvEntryBytes, 288u);
  EXPECT_EQ(kIndexKeyEntryBytes, 68u);
  EXPECT_EQ(kWindowKvEntryBytes, 528u);
}

}  // namespace
}  // namespace cedar::ops
