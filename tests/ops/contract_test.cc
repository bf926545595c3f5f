// The numerics contract's building blocks (docs/NUMERICS.md §1): the elementwise functions of
// exact_math.h against long double evaluations rounded once, and the documented float64 lane order of
// the canonical dot (dot_canonical.h) on hand-worked cases, scalar and on every SIMD target.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/simd/dot_canonical.h"
#include "ops/simd/exact_math.h"
#include "ops/linear/linear.h"
#include "ops_test_util.h"
#include "simd_targets.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h and simd_targets.h

// Deterministic arguments: a dense uniform sweep of [lo, hi] plus random floats in it.
std::vector<float> sweep(float lo, float hi, size_t n, uint32_t seed) {
  std::vector<float> v;
  for (size_t i = 0; i <= n; ++i) v.push_back(lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n));
  Rng rng(seed);
  const std::vector<float> drawn = random_uniform(n, rng, lo, hi);
  v.insert(v.end(), drawn.begin(), drawn.end());
  return v;
}

// long double has 11 more significand bits than double, so these are the correctly rounded fp32
// values except where the exact value is within ~2^-64 relative of an fp32 rounding boundary.
float exp_ld(float x) { return static_cast<float>(std::exp(static_cast<long double>(x))); }
float sigmoid_ld(float x) { return static_cast<float>(1.0L / (1.0L + std::exp(-static_cast<long double>(x)))); }
float silu_ld(float x) {
  const long double v = x;
  return static_cast<float>(v / (1.0L + std::exp(-v)));
}

TEST(ExactMath, ExpSigmoidSiluAreRoundedOnce) {
  size_t n = 0;
  for (float x : sweep(-30.0f, 30.0f, 60000, 1)) {
    ASSERT_EQ(bits_of(exp_f32(x)), bits_of(exp_ld(x))) << x;
    ASSERT_EQ(bits_of(sigmoid_f32(x)), bits_of(sigmoid_ld(x))) << x;
    ASSERT_EQ(bits_of(silu_f32(x)), bits_of(silu_ld(x))) << x;
    ++n;
  }
  EXPECT_EQ(n, 120001u);
  EXPECT_EQ(exp_f32(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(sigmoid_f32(-200.0f), 0.0f);  // exp(200) overflows nothing in double: 1 / (1 + 7e86)
  EXPECT_GT(sigmoid_f32(-100.0f), 0.0f);  // 3.7e-44, an fp32 subnormal, not flushed
  EXPECT_EQ(sigmoid_f32(100.0f), 1.0f);
  EXPECT_EQ(silu_f32(0.0f), 0.0f);
}

TEST(ExactMath, SoftplusHasTorchThresholdAndIsRoundedOnce) {
  for (float x : sweep(-40.0f, 20.0f, 30000, 2)) {
    const float want = static_cast<float>(std::log1p(std::exp(static_cast<long double>(x))));
    ASSERT_EQ(bits_of(softplus_f32(x)), bits_of(want)) << x;
  }
  EXPECT_EQ(softplus_f32(20.0f), static_cast<float>(std::log1p(std::exp(20.0L))));  // not above 20
  EXPECT_EQ(softplus_f32(20.5f), 20.5f);                                             // x itself
  EXPECT_EQ(softplus_f32(1000.0f), 1000.0f);
}

TEST(ExactMath, RsqrtCosSinAreRoundedOnce) {
  for (float v : sweep(1e-6f, 1e4f, 30000, 3)) {
    ASSERT_EQ(bits_of(rsqrt_f32(v)), bits_of(static_cast<float>(1.0L / std::sqrt(static_cast<long double>(v))))) << v;
  }
  for (float a : sweep(-3000.0f, 3000.0f, 30000, 4)) {
    ASSERT_EQ(bits_of(cos_f32(a)), bits_of(static_cast<float>(std::cos(static_cast<long double>(a))))) << a;
    ASSERT_EQ(bits_of(sin_f32(a)), bits_of(static_cast<float>(std::sin(static_cast<long double>(a))))) << a;
  }
  EXPECT_EQ(rsqrt_f32(0.25f), 2.0f);
  EXPECT_EQ(rsqrt_f32(0x1p-66f), 0x1p33f);
}

// The documented order: lane l = i mod 32 accumulates in index order in double, then halving folds.
// Products 2^60 (element 0), 1 and -2^60 (element 64). With the 1 at element 32 (lane 0 again) the lane
// sum 2^60 + 1 rounds to 2^60 and the lane ends at 0; at element 1 (lane 1) it survives the fold.
TEST(DotCanonical, LaneOrderIsTheDocumentedOne) {
  for (const size_t one_at : {size_t{32}, size_t{1}, size_t{96}, size_t{65}}) {
    const size_t k = 100;
    std::vector<float> a(k, 0.0f), b(k, 0.0f);
    a[0] = 0x1p30f;
    b[0] = 0x1p30f;
    a[64] = -0x1p30f;
    b[64] = 0x1p30f;
    a[one_at] = 1.0f;
    b[one_at] = 1.0f;
    // Element 96 shares lane 0 but comes after the cancellation; 65 is lane 1.
    const float want = one_at == 32 ? 0.0f : 1.0f;
    EXPECT_EQ(dot_canonical(a.data(), b.data(), k), want) << one_at;
    for_each_simd_target([&] {
      float y = -1.0f;
      linear_f32(a.data(), 1, F32Weight{b.data(), 1, k}, &y, nullptr);
      EXPECT_EQ(y, want) << one_at;
    });
  }
}

// Products that do not fit fp32 (f32 x f32) are formed exactly: (1 + 2^-23)^2 = 1 + 2^-22 + 2^-46, and
// minus (1 + 2^-22) leaves exactly 2^-46, which an fp32 product would have lost.
TEST(DotCanonical, ProductsAreExact) {
  const float a[2] = {1.0f + 0x1p-23f, -(1.0f + 0x1p-22f)};
  const float b[2] = {1.0f + 0x1p-23f, 1.0f};
  EXPECT_EQ(dot_canonical(a, b, 2), 0x1p-46f);
  EXPECT_EQ(static_cast<float>(dot_rounded_products_f64(a, b, 2)), 0.0f);  // fp32 products: 1 + 2^-22 each
  for_each_simd_target([&] {
    float y = -1.0f;
    linear_f32(a, 1, F32Weight{b, 1, 2}, &y, nullptr);
    EXPECT_EQ(y, 0x1p-46f);
  });
}

TEST(DotCanonical, MeanSquareIsTheDoubleQuotientRoundedOnce) {
  EXPECT_EQ(mean_square_f32(12.0 + 13.0, 2), 12.5f);
  // Near 2^24 the fp32 spacing is 2: (2^25 + 3) / 2 = 2^24 + 1.5 rounds to 2^24 + 2 and
  // (2^25 + 1) / 2 = 2^24 + 0.5 to 2^24.
  EXPECT_EQ(mean_square_f32(0x1p25 + 3.0, 2), 0x1p24f + 2.0f);
  EXPECT_EQ(mean_square_f32(0x1p25 + 1.0, 2), 0x1p24f);
  // 3 * (1 + 2^-23) + 2^-40 over 3 sits just above 1 + 2^-23 -> 1 + 2^-23, exactly representable.
  EXPECT_EQ(mean_square_f32(3.0 * (1.0 + 0x1p-23) + 0x1p-40, 3), 1.0f + 0x1p-23f);
}

}  // namespace
}  // namespace cedar::ops
