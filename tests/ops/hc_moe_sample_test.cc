// mHC helpers, MoE routing / SwiGLU and sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/thread_pool.h"
#include "ops/formats/formats.h"
#include "ops/block/hc.h"
#include "ops/block/moe.h"
#include "ops/sample/sample.h"
#include "ops_test_util.h"
#include "simd_targets.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h and simd_targets.h

// ---- mHC ----

TEST(HcSinkhorn, ZeroMixesGiveUniformComb) {
  float mixes[24] = {}, scale[3] = {1, 1, 1}, base[24] = {};
  float pre[4], post[4], comb[16];
  hc_split_sinkhorn(mixes, scale, base, 4, 20, 1e-6f, pre, post, comb);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(pre[j], 0.5f + 1e-6f);
    EXPECT_EQ(post[j], 1.0f);
  }
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(comb[i], 0.25f, 1e-6f);
}

// Same algorithm in double, written from spec §2.7: the f32 version must agree to ~1e-5 relative,
// end on a column normalisation (columns sum to 1 within the eps) and be close to doubly stochastic.
TEST(HcSinkhorn, AgreesWithDoubleAndIsDoublyStochastic) {
  Rng rng(1);
  Normal normal(0.0f, 2.0f);
  for (int trial = 0; trial < 20; ++trial) {
    float mixes[24], scale[3], base[24];
    for (auto& v : mixes) v = normal(rng);
    for (auto& v : base) v = normal(rng);
    for (auto& v : scale) v = std::fabs(normal(rng));
    float pre[4], post[4], comb[16];
    hc_split_sinkhorn(mixes, scale, base, 4, 20, 1e-6f, pre, post, comb);
    double c[4][4];
    for (int j = 0; j < 4; ++j) {
      const double want_pre = 1.0 / (1.0 + std::exp(-(double(mixes[j]) * scale[0] + base[j]))) + 1e-6;
      const double want_post = 2.0 / (1.0 + std::exp(-(double(mixes[4 + j]) * scale[1] + base[4 + j])));
      EXPECT_NEAR(pre[j], want_pre, 1e-6);
      EXPECT_NEAR(post[j], want_post, 2e-6);
      double mx = -1e300, sum = 0;
      for (int k = 0; k < 4; ++k) {
        c[j][k] = double(mixes[8 + 4 * j + k]) * scale[2] + base[8 + 4 * j + k];
        mx = std::max(mx, c[j][k]);
      }
      for (int k = 0; k < 4; ++k) sum += (c[j][k] = std::exp(c[j][k] - mx));
      for (int k = 0; k < 4; ++k) c[j][k] = c[j][k] / sum + 1e-6;
    }
    for (int it = 0; it < 20; ++it) {
      if (it > 0) {
        for (int j = 0; j < 4; ++j) {
          double s = 0;
          for (int k = 0; k < 4; ++k) s += c[j][k];
          for (int k = 0; k < 4; ++k) c[j][k] /= s + 1e-6;
        }
      }
      for (int k = 0; k < 4; ++k) {
        double s = 0;
        for (int j = 0; j < 4; ++j) s += c[j][k];
        for (int j = 0; j < 4; ++j) c[j][k] /= s + 1e-6;
      }
    }
    for (int j = 0; j < 4; ++j) {
      double col = 0;
      for (int k = 0; k < 4; ++k) {
        EXPECT_NEAR(comb[j * 4 + k], c[j][k], 1e-5 * std::max(1.0, c[j][k])) << trial;
        col += comb[k * 4 + j];
      }
      EXPECT_NEAR(col, 1.0, 1e-5);
    }
  }
}

// The contract restated step by step (hc.h): f32 arithmetic in the kernel's order with sigmoid and
// exp evaluated in long double and rounded once; row / column sums left to right in f32.
TEST(HcSinkhorn, FollowsTheContractStepByStep) {
  Rng rng(7);
  Normal normal(0.0f, 2.0f);
  const auto sigmoid_once = [](float v) {
    return static_cast<float>(1.0L / (1.0L + std::exp(-static_cast<long double>(v))));
  };
  const float eps = 1e-6f;
  for (int trial = 0; trial < 50; ++trial) {
    float mixes[24], scale[3], base[24];
    for (auto& v : mixes) v = normal(rng);
    for (auto& v : base) v = normal(rng);
    for (auto& v : scale) v = std::fabs(normal(rng));
    float pre[4], post[4], comb[16];
    hc_split_sinkhorn(mixes, scale, base, 4, 20, eps, pre, post, comb);
    float c[4][4];
    for (int j = 0; j < 4; ++j) {
      ASSERT_EQ(bits_of(pre[j]), bits_of(sigmoid_once(mixes[j] * scale[0] + base[j]) + eps)) << trial;
      ASSERT_EQ(bits_of(post[j]), bits_of(2.0f * sigmoid_once(mixes[4 + j] * scale[1] + base[4 + j]))) << trial;
      float mx = -INFINITY;
      for (int k = 0; k < 4; ++k) mx = std::max(mx, c[j][k] = mixes[8 + 4 * j + k] * scale[2] + base[8 + 4 * j + k]);
      for (int k = 0; k < 4; ++k) c[j][k] = static_cast<float>(std::exp(static_cast<long double>(c[j][k] - mx)));
      const float sum = ((c[j][0] + c[j][1]) + c[j][2]) + c[j][3];
      for (int k = 0; k < 4; ++k) c[j][k] = c[j][k] / sum + eps;
    }
    for (int it = 0; it < 20; ++it) {
      if (it > 0) {
        for (int j = 0; j < 4; ++j) {
          const float den = (((c[j][0] + c[j][1]) + c[j][2]) + c[j][3]) + eps;
          for (int k = 0; k < 4; ++k) c[j][k] = c[j][k] / den;
        }
      }
      for (int k = 0; k < 4; ++k) {
        const float den = (((c[0][k] + c[1][k]) + c[2][k]) + c[3][k]) + eps;
        for (int j = 0; j < 4; ++j) c[j][k] = c[j][k] / den;
      }
    }
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 4; ++k) ASSERT_EQ(bits_of(comb[j * 4 + k]), bits_of(c[j][k])) << trial << " " << j << k;
  }
}

TEST(HcPrePost, HandWorked) {
  // 2 streams of dim 3 (hc_mult 2 keeps the arithmetic small).
  const float x[6] = {1, 2, 3, 10, 20, 30};  // [hc=2, dim=3]
  const float a[2] = {0.5f, 0.25f};
  float out[3];
  hc_pre(x, a, 1, 2, 3, out);
  EXPECT_EQ(out[0], 3.0f);  // 0.5 + 2.5
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_EQ(out[2], 9.0f);
  // post_k * y + Σ_j comb[j][k] R_j: comb = [[1, 0.5], [0, 0.5]] -> column 0 takes R_0, column 1 the mean.
  const float y[3] = {1, 1, 1}, post[2] = {2, 0}, comb[4] = {1, 0.5f, 0, 0.5f};
  float res[6];
  hc_post(y, x, post, comb, 1, 2, 3, res);
  EXPECT_EQ(res[0], 3.0f);  // 2*1 + 1
  EXPECT_EQ(res[2], 5.0f);  // 2*1 + 3
  EXPECT_EQ(res[3], 5.5f);  // 0 + (1 + 10)/2
  EXPECT_EQ(res[5], 16.5f);
  // bf16 rounding of the result: 1 + 2^-9 is not bf16 -> 1.
  const float y2[1] = {0x1p-9f}, r2[2] = {1, 0}, p2[2] = {1, 1}, c2[4] = {1, 0, 0, 0};
  float o2[2];
  hc_post(y2, r2, p2, c2, 1, 2, 1, o2);
  EXPECT_EQ(o2[0], 1.0f);
}

// Values that stress the bf16 rounding and the order of operations: bf16-valued normals, exact ties,
// subnormals, signed zeros, infinities and NaN.
std::vector<float> hard_values(size_t n, uint32_t seed) {
  Rng rng(seed);
  Normal normal(0.0f, 3.0f);
  UniformInt<int> pick(0, 19);
  const float specials[] = {0.0f, -0.0f, 0x1p-130f, -0x1p-140f, 1.0f + 0x1p-8f, 1.0f + 0x1p-9f, 3.0f + 0x1p-7f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 0x1.fffffep127f};
  std::vector<float> v(n);
  for (auto& x : v) {
    const int k = pick(rng);
    x = k < 11 && k % 3 == 0 ? specials[k] : (k < 15 ? round_bf16(normal(rng)) : normal(rng));
  }
  return v;
}

// hc_pre and hc_post are Highway vectors over dim with the scalar reference's operations in its
// order: bit for bit the reference on every target, tails (dims not a multiple of the lanes) included.
TEST(HcPrePost, EqualTheScalarReferenceOnEveryTarget) {
  for (int hc : {1, 2, 4, 7}) {
    for (size_t dim : {1, 5, 16, 37, 1024}) {
      SCOPED_TRACE("hc " + std::to_string(hc) + " dim " + std::to_string(dim));
      const size_t tokens = 3, h = static_cast<size_t>(hc);
      const auto x = hard_values(tokens * h * dim, 10 + hc), y = hard_values(tokens * dim, 20 + hc);
      const auto a = hard_values(tokens * h, 30 + hc), post = hard_values(tokens * h, 40 + hc);
      const auto comb = hard_values(tokens * h * h, 50 + hc);
      std::vector<float> want_pre(tokens * dim), want_post(tokens * h * dim);
      ref::hc_pre(x.data(), a.data(), tokens, hc, dim, want_pre.data());
      ref::hc_post(y.data(), x.data(), post.data(), comb.data(), tokens, hc, dim, want_post.data());
      for_each_simd_target([&] {
        std::vector<float> got_pre(tokens * dim), got_post(tokens * h * dim);
        hc_pre(x.data(), a.data(), tokens, hc, dim, got_pre.data());
        hc_post(y.data(), x.data(), post.data(), comb.data(), tokens, hc, dim, got_post.data());
        for (size_t i = 0; i < got_pre.size(); ++i) ASSERT_EQ(bits_of(got_pre[i]), bits_of(want_pre[i])) << "pre " << i;
        for (size_t i = 0; i < got_post.size(); ++i)
          ASSERT_EQ(bits_of(got_post[i]), bits_of(want_post[i])) << "post " << i;
      });
    }
  }
}

// The contract restated: each X·fn_j is the exact dot (bf16 x f32 products are exact in long double,
// and with fn on a 2^-30 grid of 20-bit values the 2560-term sums are exact there too) rounded once;
// the statistic is the exact sum of squares over hc_dim rounded once, the rsqrt rounded once; then an
// f32 multiply. Every SIMD target gives the same bits.
TEST(HcMixes, FollowTheContractOnEveryTarget) {
  Rng rng(2);
  Normal normal(0.0f, 1.0f);
  UniformInt<int32_t> mant(-(1 << 20) + 1, (1 << 20) - 1);
  const size_t tokens = 3, hc_dim = 4 * 640, n_mix = 24;
  std::vector<float> x(tokens * hc_dim), fn(n_mix * hc_dim);
  for (auto& v : x) v = round_bf16(normal(rng));
  for (auto& v : fn) v = std::ldexp(static_cast<float>(mant(rng)), -30);
  std::vector<float> want(tokens * n_mix);
  for (size_t t = 0; t < tokens; ++t) {
    const float* xt = x.data() + t * hc_dim;
    long double ss = 0;
    for (size_t i = 0; i < hc_dim; ++i) ss += static_cast<long double>(xt[i]) * xt[i];
    const float mean = static_cast<float>(ss / hc_dim);
    const float r = static_cast<float>(1.0L / std::sqrt(static_cast<long double>(mean + 1e-20f)));
    for (size_t j = 0; j < n_mix; ++j) {
      long double dot = 0;
      for (size_t i = 0; i < hc_dim; ++i) dot += static_cast<long double>(xt[i]) * fn[j * hc_dim + i];
      want[t * n_mix + j] = static_cast<float>(dot) * r;
    }
  }
  std::vector<float> got_ref(tokens * n_mix);
  ref::hc_mixes(x.data(), tokens, hc_dim, fn.data(), n_mix, 1e-20f, got_ref.data());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(bits_of(got_ref[i]), bits_of(want[i])) << i;
  ThreadPool pool(2);
  for_each_simd_target([&] {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> got(tokens * n_mix);
      hc_mixes(x.data(), tokens, hc_dim, fn.data(), n_mix, 1e-20f, got.data(), p);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << i;
    }
  });
}

// The fast mixes against the exact ones (the float64-reordering bound): the op registry's hc_mixes
// cases (harness/op_cases_elementwise.cc), on every target, inline and on a pool.

// ---- MoE ----

TEST(Moe, SqrtSoftplusFollowsTorchThreshold) {
  // Below the threshold: log1p(exp(x)) evaluated in extended precision and rounded once, then sqrtf.
  for (float x = -30.0f; x < 20.0f; x += 0.0137f) {
    const float sp = static_cast<float>(std::log1p(std::exp(static_cast<long double>(x))));
    ASSERT_EQ(bits_of(sqrt_softplus(x)), bits_of(std::sqrt(sp))) << x;
  }
  EXPECT_FLOAT_EQ(sqrt_softplus(0.0f), std::sqrt(std::log(2.0f)));
  EXPECT_EQ(sqrt_softplus(25.0f), 5.0f);                    // above 20: softplus(x) = x
  EXPECT_FLOAT_EQ(sqrt_softplus(20.0f), std::sqrt(20.0f));  // log1p(exp(20)) = 20 + 2e-9
  EXPECT_GT(sqrt_softplus(-100.0f), 0.0f);
  EXPECT_LT(sqrt_softplus(-100.0f), 1e-20f);
}

TEST(Moe, RouterSelectsWithBiasWeighsWithoutAndNormalises) {
  // Scores s_e = sqrt(softplus(logit)); logits 25 -> 5, 16 -> 4.0000..., -100 -> ~0.
  const float logits[5] = {25.0f, -100.0f, 16.0f, -100.0f, 25.0f};
  const float bias[5] = {0.0f, 10.0f, 0.0f, 0.0f, 0.0f};  // expert 1 selected by bias alone
  int32_t ids[3];
  float w[3];
  route_sqrt_softplus(logits, bias, 5, 3, 1.5f, ids, w);
  // Biased keys: 5, 10+tiny, ~4, tiny, 5 -> order 1, 0, 4 (0 before 4 on the tie).
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 0);
  EXPECT_EQ(ids[2], 4);
  const float s1 = sqrt_softplus(-100.0f);
  const float sum = s1 + 5.0f + 5.0f;
  EXPECT_EQ(w[0], s1 / (sum + 1e-20f) * 1.5f);
  EXPECT_EQ(w[1], 5.0f / (sum + 1e-20f) * 1.5f);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.5f, 1e-6f);
  // top_k = 1: no normalisation, only the scale.
  route_sqrt_softplus(logits, bias, 5, 1, 1.5f, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(w[0], s1 * 1.5f);
}

// The weight sum feeds a division, so the contract takes it exactly and rounds once. Scores 5 and two
// of about 1.5e-7: each small one is below half an fp32 ulp of 5 (2.4e-7), so an fp32 running sum stays
// at 5, but together they exceed it and the exact sum rounds up to the next float.
TEST(Moe, RouterWeightSumIsExactThenRounded) {
  const float logits[3] = {25.0f, -31.4f, -31.4f};
  const float bias[3] = {0.0f, 0.0f, 0.0f};
  int32_t ids[3];
  float w[3];
  route_sqrt_softplus(logits, bias, 3, 3, 1.5f, ids, w);
  const float s_big = sqrt_softplus(25.0f), s_small = sqrt_softplus(-31.4f);
  ASSERT_EQ(s_big, 5.0f);
  const float fp32_sum = (s_big + s_small) + s_small;
  const float exact_sum = static_cast<float>(static_cast<long double>(s_big) + s_small + s_small);
  ASSERT_EQ(fp32_sum, 5.0f);
  ASSERT_EQ(exact_sum, std::nextafter(5.0f, 10.0f));
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(w[0], 5.0f / (exact_sum + 1e-20f) * 1.5f);
  EXPECT_EQ(w[1], s_small / (exact_sum + 1e-20f) * 1.5f);
}

TEST(Moe, SwigluClampsAndWeights) {
  const float g[4] = {20.0f, -3.0f, 1.0f, 0.0f};
  const float u[4] = {-50.0f, 2.0f, 12.0f, 5.0f};
  float out[4];
  swiglu_clamped(g, u, 4, 10.0f, 0.5f, out);
  // silu in extended precision, rounded once (numerics contract)
  const auto silu = [](float v) {
    const long double x = v;
    return static_cast<float>(x / (1.0L + std::exp(-x)));
  };
  EXPECT_EQ(out[0], round_bf16(0.5f * (silu(10.0f) * -10.0f)));  // g capped at 10, u at -10
  EXPECT_EQ(out[1], round_bf16(0.5f * (silu(-3.0f) * 2.0f)));    // gate only capped from above
  EXPECT_EQ(out[2], round_bf16(0.5f * (silu(1.0f) * 10.0f)));    // u capped at +10
  EXPECT_EQ(out[3], 0.0f);
  swiglu_clamped(g, u, 4, 0.0f, 1.0f, out);  // limit 0: no clamps
  EXPECT_EQ(out[0], round_bf16(silu(20.0f) * -50.0f));
}

// The fast SwiGLU against the exact one. Before the final bf16 rounding the two differ by a few f32
// ulps (Exp: 1 ulp; 1 + e, the division and g·sigmoid: half an ulp each, the rest the same f32
// operations), so the bf16 results are equal or adjacent, and equal unless the exact pre-rounding
// value lies within those few ulps of a rounding boundary (a few in 2^16). Below 2^-100 Exp's
// results are subnormal and only the absolute difference is bounded.
TEST(Moe, FastSwigluIsWithinOneBf16StepOfExactOnEveryTarget) {
  Rng rng(7);
  Normal normal(0.0f, 4.0f);
  UniformReal wide(-120.0f, 120.0f);
  const size_t n = 20000 + 13;  // a tail for every vector width
  std::vector<float> g(n), u(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = round_bf16(i % 4 == 0 ? wide(rng) : normal(rng));
    u[i] = round_bf16(normal(rng));
  }
  const float specials[][2] = {{0.0f, 1.0f}, {-0.0f, 1.0f}, {std::numeric_limits<float>::infinity(), 1.0f},
                               {-std::numeric_limits<float>::infinity(), 1.0f},
                               {std::numeric_limits<float>::quiet_NaN(), 1.0f},
                               {1.0f, std::numeric_limits<float>::quiet_NaN()}, {-300.0f, 2.0f}, {88.7f, -3.0f}};
  for (size_t i = 0; i < std::size(specials); ++i) g[i] = specials[i][0], u[i] = specials[i][1];
  // Ordered bf16 steps between two values of the same sign.
  const auto steps = [](float a, float b) {
    const auto key = [](float v) {
      const int32_t h = static_cast<int32_t>(bits_of(v) >> 16);
      return h & 0x8000 ? -(h & 0x7FFF) : h;
    };
    return std::abs(key(a) - key(b));
  };
  for (float limit : {10.0f, 0.0f}) {
    for (float weight : {1.0f, 0.37f}) {
      std::vector<float> want(n);
      swiglu_clamped(g.data(), u.data(), n, limit, weight, want.data());
      for_each_simd_target([&] {
        std::vector<float> got(n);
        fast::swiglu_clamped(g.data(), u.data(), n, limit, weight, got.data());
        size_t equal = 0;
        for (size_t i = 0; i < n; ++i) {
          SCOPED_TRACE("g " + std::to_string(g[i]) + " u " + std::to_string(u[i]));
          if (std::isnan(want[i])) {
            ASSERT_TRUE(std::isnan(got[i])) << i;
            ++equal;
            continue;
          }
          equal += bits_of(got[i]) == bits_of(want[i]);
          if (std::fabs(want[i]) < 0x1p-100f) {
            ASSERT_LE(std::fabs(got[i] - want[i]), 0x1p-100f) << i;
          } else {
            ASSERT_LE(steps(got[i], want[i]), 1) << i << ": " << got[i] << " vs " << want[i];
          }
        }
        EXPECT_GE(equal, n - n / 100) << "more than 1% of the outputs differ";
      });
    }
  }
  // The fast op in place (out aliasing g), as the forward pass calls it.
  std::vector<float> inplace = g, want(n);
  fast::swiglu_clamped(g.data(), u.data(), n, 10.0f, 1.0f, want.data());
  fast::swiglu_clamped(inplace.data(), u.data(), n, 10.0f, 1.0f, inplace.data());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits_of(inplace[i]), bits_of(want[i])) << i;
}

// ---- sampling ----

TEST(Sample, ArgmaxFirstOnTiesAndNaN) {
  const float x[5] = {1, 3, 3, 2, 3};
  EXPECT_EQ(argmax(x, 5), 1);
  const float y[4] = {1, NAN, 5, NAN};
  EXPECT_EQ(argmax(y, 4), 1);
  const float z[3] = {-INFINITY, -INFINITY, -INFINITY};
  EXPECT_EQ(argmax(z, 3), 0);
}

TEST(Sample, RngIsSeededAndUniformOpenAtZero) {
  SampleRng a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t va = a.next_u64();
    EXPECT_EQ(va, b.next_u64());
    differs |= va != c.next_u64();
  }
  EXPECT_TRUE(differs);
  SampleRng r(7);
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = r.next_uniform_open0();
    ASSERT_GT(u, 0.0);
    ASSERT_LE(u, 1.0);
    sum += r.next_exponential();
  }
  EXPECT_NEAR(sum / n, 1.0, 0.01);  // Exp(1) mean; sd of the mean is 0.0022
}

TEST(Sample, TemperatureZeroIsArgmaxAndRaceFollowsSoftmax) {
  const float logits[3] = {0.0f, std::log(2.0f), std::log(3.0f)};  // p = 1/6, 2/6, 3/6
  SampleRng rng(123);
  EXPECT_EQ(sample_token(logits, 3, 0.0f, rng), 2);
  int counts[3] = {0, 0, 0};
  const int n = 60000;
  for (int i = 0; i < n; ++i) counts[sample_token(logits, 3, 1.0f, rng)]++;
  // Binomial sd <= sqrt(n/4) ~ 122 -> 0.002 in frequency; 0.01 is > 4 sd.
  EXPECT_NEAR(counts[0] / double(n), 1.0 / 6, 0.01);
  EXPECT_NEAR(counts[1] / double(n), 2.0 / 6, 0.01);
  EXPECT_NEAR(counts[2] / double(n), 3.0 / 6, 0.01);
  // A tiny temperature (clamped to 1e-5) is effectively greedy.
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sample_token(logits, 3, 1e-9f, rng), 2);
}

}  // namespace
}  // namespace cedar::ops
