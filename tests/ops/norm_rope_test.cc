// RMSNorm and RoPE: hand-worked values, exact-arithmetic comparisons and SIMD/reference identity.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/formats/formats.h"
#include "ops/block/norm.h"
#include "ops/attention/rope.h"
#include "ops_test_util.h"
#include "simd_targets.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h and simd_targets.h

TEST(RmsNorm, HandWorked) {
  // x = [3, 4]: mean square 12.5, rsqrt = 0.2828427; y = [0.8485, 1.1314] -> bf16 [0.84765625, 1.1328125].
  const float x[2] = {3.0f, 4.0f};
  const uint16_t w[2] = {0x3F80, 0x4000};  // weights 1, 2
  float y[2];
  rms_norm(x, 1, 2, w, 0.0f, y);
  EXPECT_EQ(y[0], 0.84765625f);
  EXPECT_EQ(y[1], 2.265625f);  // 2 * 1.1313708 = 2.2627 -> bf16 2.265625
  // A zero row with eps 1e-20 stays zero (no NaN).
  const float z[4] = {0, 0, 0, 0};
  const float wf[4] = {1, 1, 1, 1};
  float yz[4];
  rms_norm(z, 1, 4, wf, kRmsNormEpsV41, yz);
  for (float v : yz) EXPECT_EQ(v, 0.0f);
}

TEST(RmsNorm, WithinOneBf16UlpOfExactAndWeightFormsAgree) {
  const size_t dim = 5120;
  const auto x = random_bf16(2 * dim, 1, 3.0f);
  const auto wf = random_bf16(dim, 2);
  std::vector<uint16_t> wb(dim);
  f32_to_bf16(wf.data(), wb.data(), dim);
  std::vector<float> y1(2 * dim), y2(2 * dim), yr(2 * dim);
  rms_norm(x.data(), 2, dim, wb.data(), 1e-20f, y1.data());
  rms_norm(x.data(), 2, dim, wf.data(), 1e-20f, y2.data());
  ref::rms_norm(x.data(), 2, dim, wf.data(), 1e-20f, yr.data());
  for (size_t r = 0; r < 2; ++r) {
    double ss = 0;
    for (size_t i = 0; i < dim; ++i) ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-20);
    for (size_t i = 0; i < dim; ++i) {
      const double exact = wf[i] * (x[r * dim + i] * inv);
      ASSERT_EQ(bits_of(y1[r * dim + i]), bits_of(y2[r * dim + i]));
      ASSERT_EQ(bits_of(y1[r * dim + i]), bits_of(yr[r * dim + i]));
      ASSERT_LE(std::fabs(yr[r * dim + i] - exact), bf16_ulp(exact)) << i;
    }
  }
}

// The numerics contract restated independently (docs/NUMERICS.md §1): the squares of bf16 values are
// exact and their sum fits long double's 64-bit significand, so it is exact; the mean is that sum over
// dim rounded once; the rsqrt is evaluated in long double and rounded once; then fp32 products.
TEST(RmsNorm, FollowsTheContractExactly) {
  const size_t dim = 5120;
  const auto x = random_bf16(3 * dim, 21, 3.0f);
  const auto w = random_bf16(dim, 22);
  std::vector<float> got(3 * dim), got_ref(3 * dim);
  rms_norm(x.data(), 3, dim, w.data(), kRmsNormEpsV41, got.data());
  ref::rms_norm(x.data(), 3, dim, w.data(), kRmsNormEpsV41, got_ref.data());
  for (size_t r = 0; r < 3; ++r) {
    long double sum = 0;
    for (size_t i = 0; i < dim; ++i) sum += static_cast<long double>(x[r * dim + i]) * x[r * dim + i];
    const float mean = static_cast<float>(sum / dim);
    const float inv = static_cast<float>(1.0L / std::sqrt(static_cast<long double>(mean + kRmsNormEpsV41)));
    EXPECT_EQ(bits_of(rms_rsqrt(x.data() + r * dim, dim, kRmsNormEpsV41)), bits_of(inv));
    for (size_t i = 0; i < dim; ++i) {
      const float want = round_bf16(w[i] * (x[r * dim + i] * inv));
      ASSERT_EQ(bits_of(got[r * dim + i]), bits_of(want)) << r << " " << i;
      ASSERT_EQ(bits_of(got_ref[r * dim + i]), bits_of(want)) << r << " " << i;
    }
  }
}

TEST(RmsNorm, SimdBitIdenticalToReferenceOnEveryTarget) {
  for (size_t dim : {7u, 128u, 512u, 1280u, 5120u}) {
    const auto x = random_bf16(3 * dim, 10 + static_cast<uint32_t>(dim));
    const auto w = random_bf16(dim, 3);
    std::vector<float> want(3 * dim);
    ref::rms_norm(x.data(), 3, dim, w.data(), 1e-20f, want.data());
    const float want_r = ref::rms_rsqrt(x.data(), dim, 1e-20f);
    for_each_simd_target([&] {
      std::vector<float> got(3 * dim);
      rms_norm(x.data(), 3, dim, w.data(), 1e-20f, got.data());
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << dim << " @" << i;
      ASSERT_EQ(bits_of(rms_rsqrt(x.data(), dim, 1e-20f)), bits_of(want_r));
    });
  }
}

TEST(Rope, YarnBandForV41CompressedLayers) {
  // d = 64, base 160000, YaRN factor 16, orig 65536, beta 32/1: spec §2.5 derives low = 15, high = 25.
  const RopeTable yarn(64, 160000.0, YarnParams{16.0, 32.0, 1.0, 65536}, 0);
  const RopeTable plain(64, 160000.0, std::nullopt, 0);
  for (int i = 0; i < 32; ++i) {
    const float f = plain.inv_freq()[i];
    const float g = yarn.inv_freq()[i];
    if (i <= 15) {  // ramp 0: unchanged
      EXPECT_EQ(g, f) << i;
    } else if (i >= 25) {  // ramp 1: divided by the factor
      EXPECT_EQ(g, f / 16.0f) << i;
    } else {  // linear fade in between
      const double ramp = (i - 15) / 10.0;
      EXPECT_NEAR(g, f / 16.0 * ramp + f * (1 - ramp), 4e-7 * f) << i;
    }
  }
}

TEST(Rope, InvFreqMatchesDefinition) {
  const RopeTable t(64, 10000.0, std::nullopt, 0);
  EXPECT_EQ(t.inv_freq()[0], 1.0f);
  EXPECT_EQ(t.inv_freq()[16], 0.01f);  // 10000^-0.5 = 1/100, correctly rounded
  for (int i = 0; i < 32; ++i) {
    const double want = 1.0 / std::pow(10000.0, 2.0 * i / 64.0);
    EXPECT_NEAR(t.inv_freq()[i], want, want * 0x1p-23) << i;
  }
}

TEST(Rope, RotatesInterleavedPairsOfTheLastDimsOnly) {
  const size_t head_dim = 512, heads = 3, tokens = 4;
  const RopeTable t(64, 10000.0, std::nullopt, 16);
  const auto x0 = random_bf16(tokens * heads * head_dim, 5);
  auto x = x0;
  apply_rope(t, x.data(), tokens, heads, head_dim, 5, 2);  // positions 5, 7, 9, 11
  for (size_t tok = 0; tok < tokens; ++tok) {
    const float pos = static_cast<float>(5 + 2 * tok);
    for (size_t h = 0; h < heads; ++h) {
      const size_t base = (tok * heads + h) * head_dim;
      for (size_t d = 0; d < 448; ++d) ASSERT_EQ(x[base + d], x0[base + d]);  // nope dims untouched
      for (size_t i = 0; i < 32; ++i) {
        const float angle = pos * t.inv_freq()[i];  // f32 product, as the reference
        const double c = std::cos(static_cast<double>(angle)), s = std::sin(static_cast<double>(angle));
        const double a = x0[base + 448 + 2 * i], b = x0[base + 448 + 2 * i + 1];
        const double re = a * c - b * s, im = a * s + b * c;
        ASSERT_LE(std::fabs(x[base + 448 + 2 * i] - re), bf16_ulp(re) + 1e-6 * (std::fabs(a) + std::fabs(b)));
        ASSERT_LE(std::fabs(x[base + 448 + 2 * i + 1] - im),
                  bf16_ulp(im) + 1e-6 * (std::fabs(a) + std::fabs(b)));
        ASSERT_EQ(round_bf16(x[base + 448 + 2 * i]), x[base + 448 + 2 * i]);
      }
    }
  }
}

TEST(Rope, PositionZeroIsIdentityAndInverseUndoes) {
  const RopeTable t(64, 160000.0, YarnParams{}, 8);
  const auto x0 = random_bf16(2 * 512, 6);
  auto x = x0;
  apply_rope(t, x.data(), 1, 2, 512, 0);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits_of(x[i]), bits_of(x0[i]));
  apply_rope(t, x.data(), 1, 2, 512, 123456);
  apply_rope(t, x.data(), 1, 2, 512, 123456, 1, RopeDirection::kInverse);
  for (size_t i = 0; i < x.size(); ++i) {
    // Two bf16 roundings of a rotation: within 2 ulps of the larger pair element.
    const size_t pair = (i % 512 < 448) ? i : (i & ~size_t{1});
    const float mag = std::max(std::fabs(x0[pair]), std::fabs(x0[pair + (i % 512 < 448 ? 0 : 1)]));
    ASSERT_LE(std::fabs(x[i] - x0[i]), 2.5f * bf16_ulp(mag)) << i;
  }
}

// cos / sin of the fp32 angle f32(pos) * inv_freq, evaluated in extended precision and rounded once.
TEST(Rope, CosSinAreRoundedOnceFromTheFp32Angle) {
  const RopeTable t(64, 160000.0, YarnParams{}, 600);
  float c[32], sn[32];
  for (int64_t p : {0, 1, 7, 97, 599, 600, 4095, 100000}) {
    t.cos_sin(p, c, sn);
    for (int i = 0; i < 32; ++i) {
      const long double angle = static_cast<float>(p) * t.inv_freq()[i];  // the fp32 product, widened
      ASSERT_EQ(bits_of(c[i]), bits_of(static_cast<float>(std::cos(angle)))) << p << " " << i;
      ASSERT_EQ(bits_of(sn[i]), bits_of(static_cast<float>(std::sin(angle)))) << p << " " << i;
    }
  }
}

TEST(Rope, PositionsBeyondTheCacheMatchCachedOnes) {
  const RopeTable small(64, 160000.0, YarnParams{}, 4);
  const RopeTable big(64, 160000.0, YarnParams{}, 2000);
  float c1[32], s1[32], c2[32], s2[32];
  for (int64_t p : {0, 3, 4, 1000, 1999}) {
    small.cos_sin(p, c1, s1);
    big.cos_sin(p, c2, s2);
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(bits_of(c1[i]), bits_of(c2[i]));
      ASSERT_EQ(bits_of(s1[i]), bits_of(s2[i]));
    }
  }
}

}  // namespace
}  // namespace cedar::ops
