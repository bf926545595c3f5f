// The fast linear kernels (ops/linear/linear_fast.h) against the exact ones, on every compiled SIMD target:
//   * the error bound derived in docs/NUMERICS.md ("Fast numerics"): with every product exact in fp32,
//     |fast - exact| <= (d_fast + d_exact) · 2^-24 · Σ|a·w| before the output rounding, plus one
//     rounding of each side to the output format (bf16: 2^-8 relative each);
//   * equality when every partial sum is exact in fp32 (small integers), which catches any wrong
//     scale, missing block or misplaced element that a tolerance could hide;
//   * results independent of the thread count;
//   * the normalised mean squared error over all outputs (ggml test-backend-ops style).
// The dense weights' cases are in linear_fast_dense_test.cc, the x86 forms against their scalar
// references in linear_fast_x86_test.cc; the kernel variants every case runs over (for_each_kernel) in
// simd_targets.h.
#include "ops/linear/linear_fast.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "ops/linear/activation_access.h"
#include "ops/formats/formats.h"
#include "ops/linear/x86_fp4_gemv.h"
#include "ops/kernel_set.h"
#include "ops/formats/quant.h"
#include "ops_test_util.h"
#include "simd_targets.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h and simd_targets.h

// FP8 weights as training leaves them: E4M3 codes of normal values, nearly all normal numbers (the
// uniformly random codes above are a sixteenth zero or subnormal, and the x86 FP8 GEMV decodes a
// 64-code chunk holding one of those through its tables instead of arithmetically), with a zero,
// subnormal or smallest-normal code (magnitude 0x00-0x0E) in about one chunk in four, so that both
// decodes meet within a row.
BlockWeights weight_like_fp8_weights(size_t n, size_t k, Rng& rng) {
  BlockWeights w = random_block_weights(false, n, k, rng);
  Normal normal(0.0f, 60.0f);
  UniformInt<int> special(0, 29), pick(0, 3), column(0, 63);
  for (auto& b : w.data) b = f32_to_e4m3(normal(rng));
  for (size_t at = 0; at + 64 <= w.data.size(); at += 64)
    if (pick(rng) == 0) {
      const int c = special(rng);  // 0x00-0x0E, either sign
      w.data[at + column(rng)] = static_cast<uint8_t>(c < 15 ? c : 0x80 | (c - 15));
    }
  return w;
}

void run_exact(const BlockWeights& w, const float* x, size_t m, float* y) {
  std::vector<float> scratch(fp8_act_scratch_floats(m, w.k));
  if (w.fp4) {
    linear_fp4(x, m, w.fp4w(), y, scratch, nullptr);
  } else {
    linear_fp8(x, m, w.fp8(), y, scratch, nullptr);
  }
}

void run_fast(const BlockWeights& w, const float* x, size_t m, float* y, ThreadPool* pool) {
  std::vector<float> scratch(fast::act_scratch_floats(m, w.k));
  if (w.fp4) {
    fast::linear_fp4(x, m, w.fp4w(), y, scratch, pool);
  } else {
    fast::linear_fp8(x, m, w.fp8(), y, scratch, pool);
  }
}

// m < 6: the GEMV kernel (1, 4 and 4 + 1 rows); m >= 6: the panel GEMM with partial row tiles, partial
// 16-column panels, column groups of 1-4 panels and K not a multiple of the 256-wide panel. On AMX:
// whole 16-row tiles alone (16, 64), with rows past the last one (35, 40) and only those (6-13).
constexpr Shape kShapes[] = {{1, 37, 96},  {1, 100, 1024}, {2, 33, 160},  {4, 20, 64},   {5, 70, 320},
                             {6, 16, 256}, {7, 50, 288},   {13, 33, 544}, {16, 20, 256}, {35, 90, 800},
                             {40, 70, 96}, {64, 48, 1056}};

TEST(LinearFast, BlockGemmsWithinTheDerivedBoundOfExactOnEveryTarget) {
  Rng rng(11);
  ThreadPool pool(3);
  enum Kind { kFp8Random, kFp8WeightLike, kFp4 };
  for (Kind kind : {kFp8Random, kFp8WeightLike, kFp4}) {
    const bool fp4 = kind == kFp4;
    for (const Shape& s : kShapes) {
      const auto x = random_bf16(s.m * s.k, rng, 3.0f);
      const BlockWeights w =
          kind == kFp8WeightLike ? weight_like_fp8_weights(s.n, s.k, rng) : random_block_weights(fp4, s.n, s.k, rng);
      std::vector<float> want(s.m * s.n);
      run_exact(w, x.data(), s.m, want.data());
      // Σ|a·w| per output, from the act_quant values (dequantised) and the exact weights.
      std::vector<float> scratch(fast::act_scratch_floats(s.m, s.k));
      const ActivationLayout a = ActivationAccess::layout(fast::quantize_activations(x.data(), s.m, s.k, scratch));
      std::vector<double> abs_sum(s.m * s.n, 0.0);
      for (size_t i = 0; i < s.m; ++i)
        for (size_t j = 0; j < s.n; ++j)
          for (size_t c = 0; c < s.k; ++c) abs_sum[i * s.n + j] += std::fabs(a.values[i * s.k + c] * w.value(j, c));
      // Additions on a product's path: fast <= k (sequential worst case), exact = k/32 + 1 (the fp32
      // block accumulation after exact block sums).
      const double depth = static_cast<double>(s.k) + static_cast<double>(s.k / 32) + 1.0;
      for_each_kernel([&] {
        std::vector<float> got(s.m * s.n), got_mt(s.m * s.n);
        run_fast(w, x.data(), s.m, got.data(), nullptr);
        run_fast(w, x.data(), s.m, got_mt.data(), &pool);
        double err2 = 0.0, ref2 = 0.0;
        for (size_t i = 0; i < s.m * s.n; ++i) {
          ASSERT_EQ(std::memcmp(&got[i], &got_mt[i], 4), 0) << "thread count changed output " << i;
          const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
          const double bound = 1.01 * (depth * kU32 * abs_sum[i] +
                                       kUBf16 * (std::fabs(static_cast<double>(got[i])) + std::fabs(want[i]))) +
                               1e-30;
          ASSERT_LE(diff, bound) << "kind " << kind << " m" << s.m << " n" << s.n << " k" << s.k << " @" << i
                                 << " fast " << got[i] << " exact " << want[i];
          err2 += diff * diff;
          ref2 += static_cast<double>(want[i]) * want[i];
        }
        // Both sides round to bf16: the normalised error is dominated by that rounding (~2^-18).
        EXPECT_LT(err2 / ref2, 1e-4) << "kind " << kind << " m" << s.m << " n" << s.n << " k" << s.k;
      });
    }
  }
}

TEST(LinearFast, BlockGemmsEqualExactWhenEverySumIsExact) {
  // Activations whose act_quant scale is 1 (block max 448) and small integer weights with scale 1:
  // every partial sum is an integer below 2^24, so any summation order gives the exact value.
  Rng rng(5);
  UniformInt<int> small(-8, 8);
  for (bool fp4 : {false, true}) {
    for (const Shape& s : kShapes) {
      std::vector<float> x(s.m * s.k);
      for (size_t i = 0; i < x.size(); ++i) x[i] = i % 32 == 0 ? 448.0f : static_cast<float>(small(rng));
      BlockWeights w;
      w.fp4 = fp4;
      w.n = s.n;
      w.k = s.k;
      if (fp4) {
        w.data.resize(s.n * s.k / 2);
        for (auto& b : w.data) b = static_cast<uint8_t>(rng() & 0xFF);  // E2M1 values are halves
        w.scales.assign(s.n * (s.k / 32), 128);                          // 2^1: integer weights
      } else {
        w.data.resize(s.n * s.k);
        for (auto& b : w.data) b = f32_to_e4m3(static_cast<float>(small(rng)));
        w.scales.assign(((s.n + 31) / 32) * (s.k / 32), 127);
      }
      std::vector<float> want(s.m * s.n);
      run_exact(w, x.data(), s.m, want.data());
      for_each_kernel([&] {
        std::vector<float> got(s.m * s.n);
        run_fast(w, x.data(), s.m, got.data(), nullptr);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], want[i]) << (fp4 ? "fp4" : "fp8") << " m" << s.m << " n" << s.n << " k" << s.k << " @" << i;
      });
    }
  }
}

TEST(LinearFast, GemmProductsBelowTheNormalRangeAreNotFlushed) {
  // Weight scales of 2^-100 and activations near 2^-30: every product lies near 2^-130, below fp32's
  // normal range, where the AVX512-BF16 tile would flush it to zero. The tile must decline such
  // panels; the fp32 tile keeps the subnormal products (each rounding off by at most 2^-150).
  Rng rng(13);
  UniformInt<int> small(1, 8);
  for (bool fp4 : {false, true}) {
    const size_t m = 12, n = 40, k = 256;
    BlockWeights w = random_block_weights(fp4, n, k, rng);
    for (auto& scale : w.scales) scale = 27;  // 2^-100
    for (auto& code : w.data)  // positive weights: E4M3 1..8, or two positive E2M1 codes (1..7)
      code = fp4 ? static_cast<uint8_t>(small(rng) % 7 + 1 + ((small(rng) % 7 + 1) << 4))
                 : f32_to_e4m3(static_cast<float>(small(rng)));
    auto x = random_bf16(m * k, rng, 1.0f);
    for (auto& v : x) v = std::fabs(v) * 0x1p-30f + 0x1p-31f;  // positive: the sums cannot cancel
    std::vector<float> want(m * n);
    run_exact(w, x.data(), m, want.data());
    for_each_kernel([&] {
      std::vector<float> got(m * n);
      run_fast(w, x.data(), m, got.data(), nullptr);
      for (size_t i = 0; i < m * n; ++i) {
        ASSERT_GT(want[i], 0.0f) << (fp4 ? "fp4" : "fp8") << " @" << i;
        // fp32 additions of k subnormal-scale terms, then the bf16 rounding of both sides.
        const double bound = (k + 1) * (kU32 * want[i] + 0x1p-150) + kUBf16 * 2.0 * want[i];
        ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), bound) << (fp4 ? "fp4" : "fp8") << " @" << i;
      }
    });
  }
}

TEST(LinearFast, GemmPanelsOfOneColumnGroupTakeTheirOwnTiles) {
  // A column group (four 16-row panels sharing each K step) whose panels differ: rows 32-63 have
  // 2^-100 scales, so against activations near 2^-30 their products lie below fp32's normal range and
  // those panels must take the fp32 tile, while the others take the bf16 tiles (AMX or AVX512-BF16).
  // 20 rows: a whole 16-row tile and four more. Every output within the bound, the tiny ones too, and
  // the same with a thread pool splitting the columns.
  Rng rng(17);
  UniformInt<int> small(1, 8);
  ThreadPool pool(3);
  for (bool fp4 : {false, true}) {
    const size_t m = 20, n = 96, k = 256;
    BlockWeights w = random_block_weights(fp4, n, k, rng);
    for (auto& code : w.data)  // positive weights: E4M3 1..8, or two positive E2M1 codes (1..7)
      code = fp4 ? static_cast<uint8_t>(small(rng) % 7 + 1 + ((small(rng) % 7 + 1) << 4))
                 : f32_to_e4m3(static_cast<float>(small(rng)));
    for (size_t row = 32; row < 64; ++row)
      for (size_t kb = 0; kb < k / 32; ++kb) {
        if (fp4) {
          w.scales[row * (k / 32) + kb] = 27;  // 2^-100
        } else if (row % 32 == 0) {
          w.scales[(row / 32) * (k / 32) + kb] = 27;
        }
      }
    auto x = random_bf16(m * k, rng, 1.0f);
    for (auto& v : x) v = std::fabs(v) * 0x1p-30f + 0x1p-31f;  // positive: the sums cannot cancel
    std::vector<float> want(m * n);
    run_exact(w, x.data(), m, want.data());
    std::vector<float> scratch(fast::act_scratch_floats(m, k));
    const ActivationLayout a = ActivationAccess::layout(fast::quantize_activations(x.data(), m, k, scratch));
    for_each_kernel([&] {
      std::vector<float> got(m * n), got_mt(m * n);
      run_fast(w, x.data(), m, got.data(), nullptr);
      run_fast(w, x.data(), m, got_mt.data(), &pool);
      for (size_t i = 0; i < m; ++i)
        for (size_t j = 0; j < n; ++j) {
          const size_t at = i * n + j;
          ASSERT_EQ(std::memcmp(&got[at], &got_mt[at], 4), 0) << "thread count changed output " << at;
          ASSERT_GT(want[at], 0.0f) << (fp4 ? "fp4" : "fp8") << " @" << at;
          double abs_sum = 0.0;
          for (size_t c = 0; c < k; ++c) abs_sum += std::fabs(a.values[i * k + c] * w.value(j, c));
          const double depth = static_cast<double>(k) + static_cast<double>(k / 32) + 1.0;
          const double bound = 1.01 * (depth * kU32 * abs_sum + kUBf16 * (std::fabs(got[at]) + std::fabs(want[at]))) +
                               (k + 1) * 0x1p-150;
          ASSERT_LE(std::fabs(static_cast<double>(got[at]) - want[at]), bound)
              << (fp4 ? "fp4" : "fp8") << " row " << i << " column " << j << " fast " << got[at] << " exact "
              << want[at];
        }
    });
  }
}

// Weights, activations and quantiser scratch for one batch job per shape (drawn in shape order).
struct BatchInputs {
  std::vector<BlockWeights> ws;
  std::vector<std::vector<float>> xs, scratches;
};
BatchInputs batch_inputs(const KernelSet& ks, std::span<const Shape> shapes, bool fp4, Rng& rng) {
  BatchInputs in;
  for (const Shape& s : shapes) {
    in.ws.push_back(random_block_weights(fp4, s.n, s.k, rng));
    in.xs.push_back(random_bf16(s.m * s.k, rng, 2.0f));
    in.scratches.emplace_back(ks.act_scratch_floats(s.m, s.k));
  }
  return in;
}

TEST(LinearFast, BatchedGemmsEqualSeparateOnesInBothModes) {
  // Three experts' worth of jobs with different row counts (GEMV and GEMM kernels) and widths that are
  // not multiples of the 16-row work unit: one parallel region must give each job's own results.
  Rng rng(21);
  ThreadPool pool(3);
  const Shape shapes[] = {{1, 40, 64}, {2, 70, 64}, {7, 33, 64}};
  for (Numerics mode : {Numerics::kExact, Numerics::kFast}) {
    const KernelSet& ks = kernel_set(mode);
    auto [ws, xs, scratches] = batch_inputs(ks, shapes, true, rng);
    std::vector<std::vector<float>> want, got;
    std::vector<Fp4GemmJob> jobs;
    for (size_t j = 0; j < ws.size(); ++j) {
      const PreparedActivations a = ks.quantize_activations(xs[j].data(), shapes[j].m, shapes[j].k, scratches[j]);
      want.emplace_back(shapes[j].m * shapes[j].n);
      got.emplace_back(shapes[j].m * shapes[j].n, -1.0f);
      (mode == Numerics::kFast ? fast::gemm_fp4 : gemm_fp4)(a, ws[j].fp4w(), want[j].data(), nullptr);
      jobs.push_back({a, ws[j].fp4w(), got[j].data()});
    }
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      gemm_fp4_batch(ks, jobs, p);
      for (size_t j = 0; j < jobs.size(); ++j)
        for (size_t i = 0; i < got[j].size(); ++i)
          ASSERT_EQ(std::memcmp(&got[j][i], &want[j][i], 4), 0) << numerics_name(mode) << " job " << j << " @" << i;
    }
  }
}

TEST(LinearFast, Fp8LinearBatchEqualsSeparateCallsInBothModes) {
  // GEMMs on quantised activations and wo_a-style linears on unquantised ones, GEMV and GEMM row
  // counts, widths that are not multiples of the 32-row unit: one parallel region must give each job
  // what its own call gives, bit for bit.
  Rng rng(29);
  ThreadPool pool(3);
  const Shape shapes[] = {{1, 40, 64}, {1, 96, 128}, {2, 70, 64}, {7, 33, 96}};
  for (Numerics mode : {Numerics::kExact, Numerics::kFast}) {
    const KernelSet& ks = kernel_set(mode);
    for (auto kind : {Fp8LinearJob::Kind::kGemm, Fp8LinearJob::Kind::kAsBf16}) {
      auto [ws, xs, scratches] = batch_inputs(ks, shapes, false, rng);
      std::vector<std::vector<float>> want, got;
      std::vector<Fp8LinearJob> jobs;
      for (size_t j = 0; j < ws.size(); ++j) {
        const Shape& s = shapes[j];
        want.emplace_back(s.m * s.n);
        got.emplace_back(s.m * s.n, -1.0f);
        if (kind == Fp8LinearJob::Kind::kGemm) {
          const PreparedActivations a = ks.quantize_activations_fp8(xs[j].data(), s.m, s.k, scratches[j]);
          (mode == Numerics::kFast ? fast::gemm_fp8 : gemm_fp8)(a, ws[j].fp8(), want[j].data(), nullptr);
          jobs.push_back({kind, a, ws[j].fp8(), got[j].data()});
        } else {
          (mode == Numerics::kFast ? fast::linear_fp8_bf16 : linear_fp8_bf16)(xs[j].data(), s.m, ws[j].fp8(),
                                                                              want[j].data(), LinearOut::kBf16, nullptr);
          jobs.push_back({kind, PreparedActivations::unquantized(xs[j].data(), s.m, s.k), ws[j].fp8(), got[j].data()});
        }
      }
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        fp8_linear_batch(ks, jobs, p);
        for (size_t j = 0; j < jobs.size(); ++j)
          for (size_t i = 0; i < got[j].size(); ++i)
            ASSERT_EQ(std::memcmp(&got[j][i], &want[j][i], 4), 0)
                << numerics_name(mode) << (kind == Fp8LinearJob::Kind::kGemm ? " gemm" : " as-bf16") << " job " << j
                << " @" << i;
      }
    }
  }
}

TEST(LinearFast, QuantizedActivationsEqualTheScalarE4m3Rounding) {
  // fast::quantize_activations rounds on f32 bits; the contract is f32_to_e4m3. Blocks whose largest
  // element is 447.99 have scale 1, so every other element v (|v| < 447.99) must come back as
  // e4m3(v) exactly. Tested: every f32 exponent from the smallest subnormal up, with high mantissa bits
  // enumerated and low bits varied, every E4M3 rounding midpoint and its neighbours, both signs.
  std::vector<float> probes;
  for (uint32_t exp = 0; exp <= 127 + 8; ++exp) {
    for (uint32_t high = 0; high < 256; ++high) {
      for (uint32_t low : {0u, 1u, 0x7FFFu, 0x8000u, 0x7FFFFu, 0x80000u, 0xFFFFFu}) {
        const uint32_t bits = (exp << 23) | (high << 15) | (low & 0x7FFF) | ((low >> 15) << 15);
        float v;
        std::memcpy(&v, &bits, 4);
        if (v < 447.99f) probes.push_back(v);
      }
    }
  }
  for (int code = 0; code < 0x7E; ++code) {  // midpoints between neighbouring E4M3 magnitudes
    const float mid = 0.5f * (e4m3_to_f32(static_cast<uint8_t>(code)) + e4m3_to_f32(static_cast<uint8_t>(code + 1)));
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)})
      if (v < 447.99f) probes.push_back(v);
  }
  const size_t n = probes.size();
  for (size_t i = 0; i < n; ++i) probes.push_back(-probes[i]);
  std::vector<float> x;
  for (size_t i = 0; i < probes.size(); i += 31) {
    x.push_back(447.99f);
    for (size_t j = 0; j < 31; ++j) x.push_back(i + j < probes.size() ? probes[i + j] : 0.0f);
  }
  for (size_t m : {size_t{1}, fast::kFastGemmMinRows}) {  // the GEMV (with planes) and GEMM forms
    const size_t k = 32 * 8;
    for_each_kernel([&] {
      for (size_t row0 = 0; row0 + m * k <= x.size(); row0 += m * k) {
        std::vector<float> scratch(fast::act_scratch_floats(m, k));
        const ActivationLayout a = ActivationAccess::layout(fast::quantize_activations(x.data() + row0, m, k, scratch));
        for (size_t i = 0; i < m * k; ++i) {
          ASSERT_EQ(a.scales[i / 32], 1.0f);
          const float want = e4m3_to_f32(f32_to_e4m3(x[row0 + i]));
          ASSERT_EQ(std::memcmp(&a.values[i], &want, 4), 0) << "x " << x[row0 + i] << " got " << a.values[i];
        }
      }
    });
  }
}

// The fast quantiser's block scales (max |x| in vectors) are fp8_block_scale's bits: random blocks of
// every magnitude, zero blocks, subnormal blocks, infinities and NaN blocks, in both forms.
TEST(LinearFast, QuantizedActivationScalesEqualTheScalarBlockScale) {
  Rng rng(11);
  Normal normal(0.0f, 1.0f);
  UniformInt<int> exponent(-140, 120);
  const size_t k = 32 * 24;
  std::vector<float> x(fast::kFastGemmMinRows * k);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float scale = std::ldexp(1.0f, exponent(rng));
    for (size_t j = 0; j < 32; ++j) x[b * 32 + j] = b % 7 == 0 ? 0.0f : normal(rng) * scale;
    if (b % 11 == 3) x[b * 32 + b % 32] = std::numeric_limits<float>::quiet_NaN();
    if (b % 13 == 5) x[b * 32 + (b + 7) % 32] = -std::numeric_limits<float>::infinity();
  }
  for (size_t m : {size_t{1}, fast::kFastGemmMinRows}) {
    for_each_kernel([&] {
      std::vector<float> scratch(fast::act_scratch_floats(m, k));
      const ActivationLayout a = ActivationAccess::layout(fast::quantize_activations(x.data(), m, k, scratch));
      for (size_t b = 0; b < m * k / 32; ++b) {
        const float want = fp8_block_scale(x.data() + b * 32);
        ASSERT_EQ(std::memcmp(&a.scales[b], &want, 4), 0) << "block " << b << ": " << a.scales[b] << " vs " << want;
      }
    });
  }
}

// FP4 weights of random codes with E8M0 scale 128 (2^1): every weight is an integer (E2M1 values
// are halves), so sums with integer activations stay exact in any order.
BlockWeights integer_fp4_weights(size_t n, size_t k, Rng& rng) {
  BlockWeights w;
  w.fp4 = true;
  w.n = n;
  w.k = k;
  w.data.resize(n * k / 2);
  for (auto& b : w.data) b = static_cast<uint8_t>(rng() & 0xFF);
  w.scales.assign(n * (k / 32), 128);
  return w;
}

TEST(LinearFast, Fp4GemvBf16KeepsTheSmallestQuantisedActivations) {
  x86::set_fp4_gemv_bf16_forced(true);  // where the CPU would take the VNNI form
  struct Unforce {
    ~Unforce() { x86::set_fp4_gemv_bf16_forced(false); }
  } unforce;
  if (!x86::fp4_gemv_bf16_usable()) GTEST_SKIP() << "this CPU lacks AVX512-BF16";
  // The quantiser's amax floor (1e-4: block scale 2^-22) keeps every nonzero value at or above
  // 2^-9 · 2^-22 = 2^-31, far above the 2^-125 the bf16 form needs, so it always takes the layout. A
  // row whose only nonzero block sits at that floor (E4M3 subnormals 1..7 · 2^-9) against integer
  // weights has exact sums: a flushed product would show as a difference.
  Rng rng(33);
  const size_t n = 40, k = 256;
  const BlockWeights w = integer_fp4_weights(n, k, rng);
  std::vector<float> x(k, 0.0f);
  for (size_t j = 0; j < 32; ++j) x[64 + j] = std::ldexp(static_cast<float>(j % 8) * (j % 3 ? 1.0f : -1.0f), -31);
  std::vector<float> scratch(fast::act_scratch_floats(1, k));
  const ActivationLayout a = ActivationAccess::layout(fast::quantize_activations(x.data(), 1, k, scratch));
  ASSERT_NE(a.fp4_planes.bf16_plane, nullptr);
  for (size_t j = 0; j < k; ++j) ASSERT_EQ(a.values[j], x[j]) << "the values must quantise exactly @" << j;
  std::vector<float> want(n), got(n);
  run_exact(w, x.data(), 1, want.data());
  fast::linear_fp4(x.data(), 1, w.fp4w(), got.data(), scratch, nullptr);
  size_t nonzero = 0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], want[i]) << "row " << i;
    nonzero += want[i] != 0.0f;
  }
  EXPECT_GT(nonzero, n / 2);
}

TEST(LinearFast, Fp4GemvPropagatesNonFiniteActivations) {
  // A NaN (row 0) or an infinity (row 1) in the activations: exact gives NaN in every output, and so
  // must each FP4 GEMV form. The integer planes cannot carry them (their integer conversion would be
  // undefined), so such activations take the float kernel.
  Rng rng(35);
  const size_t n = 24, k = 192, m = 2;
  const BlockWeights w = random_block_weights(true, n, k, rng);
  auto x = random_bf16(m * k, rng, 1.0f);
  x[70] = std::numeric_limits<float>::quiet_NaN();
  x[k + 150] = std::numeric_limits<float>::infinity();
  std::vector<float> want(m * n);
  run_exact(w, x.data(), m, want.data());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_TRUE(std::isnan(want[i])) << "exact @" << i;
  for_each_kernel([&] {
    std::vector<float> got(m * n);
    run_fast(w, x.data(), m, got.data(), nullptr);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isnan(got[i])) << "@" << i << ": " << got[i];
  });
}

TEST(LinearFast, Fp4GemvResidualBlocksAreExact) {
  // Blocks with elements far below their largest (E4M3 subnormals next to 448) do not fit one int16
  // plane: their low bits go to the residual list. Integer weights keep every partial sum exact in
  // fp32 (k = 96: |sum| < 2^15 at a resolution of 2^-9), so fast must equal exact bit for bit. Some
  // weight scales are 0 (E8M0 2^-127), which takes the scalar scale path.
  Rng rng(17);
  UniformInt<int> small(-8, 8), sub(1, 7), pick(0, 3);
  for (size_t m : {1, 2, 5}) {
    const size_t n = 37, k = 96 * 3;
    std::vector<float> x(m * k);
    for (size_t i = 0; i < x.size(); ++i) {
      const int p = pick(rng);
      x[i] = i % 32 == 0 ? 448.0f : p == 0 ? sub(rng) * 0x1p-9f * (small(rng) < 0 ? -1 : 1) : static_cast<float>(small(rng));
    }
    BlockWeights w = integer_fp4_weights(n, k, rng);
    for (size_t i = 0; i < w.scales.size(); i += 11) w.scales[i] = 0;
    std::vector<float> scratch(fast::act_scratch_floats(m, k));
    x86::set_fp4_gemv_bf16_allowed(false);  // the integer planes, which the bf16 form does without
    const ActivationLayout a = ActivationAccess::layout(fast::quantize_activations(x.data(), m, k, scratch));
    x86::set_fp4_gemv_bf16_allowed(true);
    ASSERT_GT(a.fp4_planes.residual_count[0], 0u) << "the data must exercise the residual blocks";
    std::vector<float> want(m * n);
    run_exact(w, x.data(), m, want.data());
    for_each_kernel([&] {
      std::vector<float> got(m * n);
      run_fast(w, x.data(), m, got.data(), nullptr);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "m" << m << " @" << i;
    });
  }
}

TEST(LinearFast, Fp4GemvSpecialScalesGiveWhatExactGives) {
  // E8M0 255 (NaN) and 0 (2^-127) weight scales in a full 8-block group and in a short one: the FP4
  // GEMV kernels turn most scales into floats by shifting the exponent and must take the table for
  // these. Integer data keep every sum exact, so fast equals exact (NaN where exact is NaN).
  // k = 11 blocks: one group of 8 and a group of 3 (the VNNI form); 37 blocks: four groups of 8 and one
  // of 5, and the bf16 form's scale chunks of 16, 16 and 5 blocks, with special scales in each.
  Rng rng(29);
  UniformInt<int> small(-8, 8);
  // m = 7 runs the GEMM, whose bf16 tile decodes FP4 rows straight to bf16 pairs for scales 2..252
  // and must leave a row with any other scale to the general decode.
  // Rows 6 and 7 are zero but for one block of ones, in the upper half of a 16-block chunk, against
  // positive activations: 2^-127 (not 0) times that block's sum, and NaN (not infinity).
  const size_t n = 8;
  for (size_t nb : {11, 37}) {
    const size_t k = 32 * nb, lone = nb > 16 ? 25 : 9;
    for (size_t m : {1, 3, 7}) {
      std::vector<float> x(m * k);
      for (size_t i = 0; i < x.size(); ++i) x[i] = i % 32 == 0 ? 448.0f : static_cast<float>(small(rng));
      for (size_t r = 0; r < m; ++r)
        for (size_t i = 1; i < 32; ++i) x[r * k + lone * 32 + i] = static_cast<float>(1 + i % 8);
      BlockWeights w = integer_fp4_weights(n, k, rng);
      for (size_t row : {6, 7}) {
        std::fill_n(w.data.begin() + row * (k / 2), k / 2, uint8_t{0});
        std::fill_n(w.data.begin() + row * (k / 2) + lone * 16, 16, uint8_t{0x22});  // E2M1 1.0 twice
      }
      w.scales[6 * nb + lone] = 0;
      w.scales[7 * nb + lone] = 255;
      w.scales[0 * nb + 3] = 255;                     // row 0: NaN in the first full group
      w.scales[1 * nb + nb - 2] = 255;                // row 1: NaN in the short group
      w.scales[2 * nb + (nb > 16 ? 20 : 5)] = 0;      // row 2: 2^-127 in a full group (the second chunk)
      w.scales[3 * nb + nb - 1] = 0;                  // row 3: 2^-127 in the short group
      w.scales[4 * nb + 2] = 2;                       // row 4: the smallest scale of the direct decode
      w.scales[5 * nb + 6] = 160;                     // row 5: 2^33
      std::vector<float> want(m * n);
      run_exact(w, x.data(), m, want.data());
      for (size_t r = 0; r < m; ++r) {
        ASSERT_TRUE(std::isnan(want[r * n + 0]) && std::isnan(want[r * n + 1]) && std::isnan(want[r * n + 7]))
            << "exact: a NaN scale gives NaN";
        ASSERT_GT(want[r * n + 6], 0.0f) << "exact: 2^-127 times a positive sum";
      }
      for_each_kernel([&] {
        std::vector<float> got(m * n);
        run_fast(w, x.data(), m, got.data(), nullptr);
        for (size_t i = 0; i < got.size(); ++i) {
          if (std::isnan(want[i])) {
            ASSERT_TRUE(std::isnan(got[i])) << "k " << k << " m" << m << " @" << i;
          } else {
            ASSERT_EQ(got[i], want[i]) << "k " << k << " m" << m << " @" << i;
          }
        }
      });
    }
  }
}

TEST(LinearFast, Fp8GemvDecodesEveryE4m3Code) {
  // Row i holds code i at column p_i; the other columns hold +1 and -1 in turn (codes 0x38, 0xB8), with
  // 2 of p_i's sign two columns along, so that they cancel. Activations all 1 (quantised exactly:
  // scale 2^-8, code 256), weight scale 1: output i is the code's value itself, which bf16 holds
  // exactly, and every partial sum is exact in fp32. Covers both signs, zero, every subnormal and
  // normal code, at even and odd columns of first, middle and (k = 160) half chunks. The fillers are
  // normal codes, so a normal code's chunk takes the x86 FP8 GEMV's arithmetic decode and a zero or
  // subnormal one's its tables. NaN codes (0x7F, 0xFF) are left out: checkpoints hold none, and the
  // Highway decoders document their ±480 for them.
  for (const size_t k : {size_t{192}, size_t{160}}) {
    const size_t n = 256;
    std::vector<uint8_t> codes(n * k), scales(n / 32 * (k / 32), 127);
    for (size_t i = 0; i < n; ++i) {
      uint8_t* row = codes.data() + i * k;
      for (size_t c = 0; c < k; ++c) row[c] = c % 2 == 0 ? 0x38 : 0xB8;  // +1, -1
      const size_t p = (i * 37) % k;
      const size_t partner = p + 2 < k ? p + 2 : p - 2;
      row[partner] = p % 2 == 0 ? 0x40 : 0xC0;  // +2 or -2: with p's filler gone the rest cancel
      row[p] = static_cast<uint8_t>(i);
    }
    const std::vector<float> x(k, 1.0f);
    for_each_kernel([&] {
      std::vector<float> y(n), scratch(fast::act_scratch_floats(1, k));
      fast::linear_fp8(x.data(), 1, Fp8Weight{codes.data(), scales.data(), n, k}, y.data(), scratch, nullptr);
      for (size_t i = 0; i < n; ++i) {
        if ((i & 0x7F) == 0x7F) continue;
        const float want = e4m3_to_f32(static_cast<uint8_t>(i));
        ASSERT_EQ(y[i], want) << "code " << i << " k " << k;  // == : a sum of -0 and +0 terms is +0
      }
    });
  }
}

TEST(LinearFast, KernelSetsSelectTheirMode) {
  EXPECT_EQ(kernel_set(Numerics::kExact).linear_fp8, &linear_fp8);
  EXPECT_EQ(kernel_set(Numerics::kFast).linear_fp8, &fast::linear_fp8);
  EXPECT_EQ(kernel_set(Numerics::kExact).pair_unquantized, nullptr);
  EXPECT_EQ(kernel_set(Numerics::kFast).sparse_attn, &fast::sparse_attn);
  EXPECT_EQ(parse_numerics("fast"), Numerics::kFast);
  EXPECT_EQ(parse_numerics("exact"), Numerics::kExact);
  EXPECT_FALSE(parse_numerics("fastest").has_value());
  // An exact-mode activation view is refused by the fast GEMMs instead of being misread.
  std::vector<float> x(64, 1.0f), scratch(fp8_act_scratch_floats(1, 64)), y(1);
  const PreparedActivations exact_a = quantize_activations(x.data(), 1, 64, scratch);
  std::vector<uint8_t> codes(64, 0x38), scales(2, 127);
  EXPECT_DEATH(fast::gemm_fp8(exact_a, Fp8Weight{codes.data(), scales.data(), 1, 64}, y.data(), nullptr),
               "fast::quantize_activations");
}

TEST(LinearFast, Fp8LinearBatchRefusesAJobWhoseActivationsDoNotMatchItsKind) {
  // A kAsBf16 job reads x unquantised, a kGemm job the quantiser's codes and scales: a handle of the
  // other form would be misread, so the batch stops with a message naming the right handle.
  std::vector<float> x(64, 1.0f), scratch(fp8_act_scratch_floats(1, 64)), y(32);
  std::vector<uint8_t> codes(32 * 64, 0x38), scales(2, 127);
  const Fp8Weight w{codes.data(), scales.data(), 32, 64};
  const PreparedActivations quantized = quantize_activations(x.data(), 1, 64, scratch);
  const PreparedActivations unquantized = PreparedActivations::unquantized(x.data(), 1, 64);
  EXPECT_EQ(unquantized.m(), 1u);
  EXPECT_EQ(unquantized.k(), 64u);
  EXPECT_TRUE(unquantized.is_unquantized());
  EXPECT_FALSE(quantized.is_unquantized());
  const Fp8LinearJob as_bf16{Fp8LinearJob::Kind::kAsBf16, quantized, w, y.data()};
  EXPECT_DEATH(fp8_linear_batch(kernel_set(Numerics::kExact), {&as_bf16, 1}, nullptr), "unquantized");
  const Fp8LinearJob gemm{Fp8LinearJob::Kind::kGemm, unquantized, w, y.data()};
  EXPECT_DEATH(fp8_linear_batch(kernel_set(Numerics::kFast), {&gemm, 1}, nullptr), "unquantized");
}

}  // namespace
}  // namespace cedar::ops
