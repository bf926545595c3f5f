// The fast linear kernels (ops/linear_fast.h) against the exact ones, on every compiled SIMD target:
//   * the error bound derived in docs/NUMERICS.md ("Fast numerics"): with every product exact in fp32,
//     |fast - exact| <= (d_fast + d_exact) · 2^-24 · Σ|a·w| before the output rounding, plus one
//     rounding of each side to the output format (bf16: 2^-8 relative each);
//   * equality when every partial sum is exact in fp32 (small integers), which catches any wrong
//     scale, missing block or misplaced element that a tolerance could hide;
//   * results independent of the thread count;
//   * the normalised mean squared error over all outputs (ggml test-backend-ops style).
#include "ops/linear_fast.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "ops/formats.h"
#include "ops/fp4_gemv_x86.h"
#include "ops/fp8_gemv_x86.h"
#include "ops/gemm_amx_x86.h"
#include "ops/gemm_bf16_x86.h"
#include "ops/kernel_set.h"
#include "ops/quant.h"
#include "ops/simd_info.h"
#include "ops/x86_features.h"
#include "ops_test_util.h"
#include "simd_targets.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h and simd_targets.h

// Every SIMD target, and on a CPU with AVX512-VBMI and AVX512-BF16 the AVX-512 targets twice: with the
// FP8 GEMV of fp8_gemv_x86.h and without it (their Highway kernel), so both are tested. Likewise the
// AVX2 and AVX-512 targets run the FP4 GEMV of fp4_gemv_x86.h in its bf16 form (AVX512-BF16), its
// VNNI form (AVX512-VNNI) and neither (the Highway kernel), as far as the CPU has them (the bf16 form
// forced where the CPU would take the VNNI one), and on a CPU
// with AVX512-BF16 every target runs with and without the GEMM tile of gemm_bf16_x86.h (and on one
// with AMX-BF16 with the AMX tiles of gemm_amx_x86.h, without them, and without both).
template <typename Fn>
void for_each_kernel(Fn&& fn) {
  for_each_simd_target([&] {
    fn();
    if (x86::fp8_gemv_bf16_usable() && dispatched_simd_target().rfind("AVX3", 0) == 0) {
      SCOPED_TRACE("without the AVX512-BF16 FP8 GEMV");
      x86::set_fp8_gemv_bf16_allowed(false);
      fn();
      x86::set_fp8_gemv_bf16_allowed(true);
    }
    const std::string target = dispatched_simd_target();
    const bool fp4_x86 = target.rfind("AVX3", 0) == 0 || target == "AVX2";
    // The FP4 GEMV forms, each with the ones it takes precedence over turned off; the bf16 form also
    // forced where the CPU prefers the VNNI one (Intel's), so that every form runs wherever it can.
    if (x86::has_avx512_bf16() && !x86::has_fast_avx512_bf16_dot() && fp4_x86) {
      SCOPED_TRACE("with the AVX512-BF16 FP4 GEMV forced");
      x86::set_fp4_gemv_bf16_forced(true);
      fn();
      x86::set_fp4_gemv_bf16_forced(false);
    }
    x86::set_fp4_gemv_bf16_allowed(false);
    if (x86::has_avx512_bf16() && fp4_x86) {
      SCOPED_TRACE("without the AVX512-BF16 FP4 GEMV");
      fn();
    }
    if (x86::fp4_gemv_vnni_usable() && fp4_x86) {
      SCOPED_TRACE("without the AVX512-BF16 and AVX512-VNNI FP4 GEMVs");
      x86::set_fp4_gemv_vnni_allowed(false);
      fn();
      x86::set_fp4_gemv_vnni_allowed(true);
    }
    x86::set_fp4_gemv_bf16_allowed(true);
    if (x86::gemm_amx_usable()) {
      SCOPED_TRACE("without the AMX GEMM tiles");
      x86::set_gemm_amx_allowed(false);
      fn();
      x86::set_gemm_amx_allowed(true);
    }
    if (x86::gemm_bf16_usable()) {
      SCOPED_TRACE("without the AMX and AVX512-BF16 GEMM tiles");
      x86::set_gemm_amx_allowed(false);
      x86::set_gemm_bf16_allowed(false);
      fn();
      x86::set_gemm_bf16_allowed(true);
      x86::set_gemm_amx_allowed(true);
    }
  });
}

// FP8 weights as training leaves them: E4M3 codes of normal values, nearly all normal numbers (the
// uniformly random codes above are a sixteenth zero or subnormal, and the x86 FP8 GEMV decodes a
// 64-code chunk holding one of those through its tables instead of arithmetically), with a zero,
// subnormal or smallest-normal code (magnitude 0x00-0x0E) in about one chunk in four, so that both
// decodes meet within a row.
BlockWeights weight_like_fp8_weights(size_t n, size_t k, std::mt19937& rng) {
  BlockWeights w = random_block_weights(false, n, k, rng);
  std::normal_distribution<float> normal(0.0f, 60.0f);
  std::uniform_int_distribution<int> special(0, 29), pick(0, 3), column(0, 63);
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

struct Shape {
  size_t m, n, k;
};
// m < 6: the GEMV kernel (1, 4 and 4 + 1 rows); m >= 6: the panel GEMM with partial row tiles, partial
// 16-column panels, column groups of 1-4 panels and K not a multiple of the 256-wide panel. On AMX:
// whole 16-row tiles alone (16, 64), with rows past the last one (35, 40) and only those (6-13).
constexpr Shape kShapes[] = {{1, 37, 96},  {1, 100, 1024}, {2, 33, 160},  {4, 20, 64},   {5, 70, 320},
                             {6, 16, 256}, {7, 50, 288},   {13, 33, 544}, {16, 20, 256}, {35, 90, 800},
                             {40, 70, 96}, {64, 48, 1056}};

TEST(LinearFast, BlockGemmsWithinTheDerivedBoundOfExactOnEveryTarget) {
  std::mt19937 rng(11);
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
      const Fp8Activations a = fast::quantize_activations(x.data(), s.m, s.k, scratch);
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
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-8, 8);
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

// Activations that are not bf16 values (full fp32 mantissas; a kernel that truncated them to bf16
// would be off by up to 2^-8) still give the fp32-accumulation bound of the exact dot.
TEST(LinearFast, GemmProductsBelowTheNormalRangeAreNotFlushed) {
  // Weight scales of 2^-100 and activations near 2^-30: every product lies near 2^-130, below fp32's
  // normal range, where the AVX512-BF16 tile would flush it to zero. The tile must decline such
  // panels; the fp32 tile keeps the subnormal products (each rounding off by at most 2^-150).
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> small(1, 8);
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
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> small(1, 8);
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
    const Fp8Activations a = fast::quantize_activations(x.data(), m, k, scratch);
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

TEST(LinearFast, Bf16WeightsWithFp32ActivationsStayWithinTheBound) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // k small, so the derived bound (proportional to k) is far below what truncating them would cost.
  for (const Shape& s : {Shape{2, 300, 64}, Shape{1, 200, 100}}) {
    std::vector<float> x(s.m * s.k);
    for (auto& v : x) v = normal(rng);  // full fp32 mantissas
    const auto wf = random_bf16(s.n * s.k, rng, 0.05f);
    std::vector<uint16_t> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16_bits(wf[i]);
    const Bf16Weight w16{wb.data(), s.n, s.k};
    std::vector<double> exact(s.m * s.n, 0.0), abs_sum(s.m * s.n, 0.0);
    for (size_t i = 0; i < s.m; ++i)
      for (size_t j = 0; j < s.n; ++j)
        for (size_t c = 0; c < s.k; ++c) {
          const double p = static_cast<double>(x[i * s.k + c]) * wf[j * s.k + c];
          exact[i * s.n + j] += p;
          abs_sum[i * s.n + j] += std::fabs(p);
        }
    for_each_kernel([&] {
      std::vector<float> got(s.m * s.n);
      fast::linear_bf16(x.data(), s.m, w16, got.data(), LinearOut::kF32, nullptr);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_LE(std::fabs(got[i] - exact[i]), 1.01 * (s.k + 1.0) * kU32 * abs_sum[i]) << "k" << s.k << " @" << i;
    });
  }
}

TEST(LinearFast, DenseWithinTheDerivedBoundOfExactOnEveryTarget) {
  std::mt19937 rng(7);
  ThreadPool pool(3);
  // k not a multiple of any vector width, too; GEMMs with k a multiple of 32 can take the AVX512-BF16
  // tile (x is bf16).
  const Shape shapes[] = {{1, 37, 7},     {1, 65, 1000}, {3, 20, 64},    {5, 33, 129}, {6, 16, 33},
                          {17, 70, 300},  {40, 19, 520}, {7, 33, 96},    {13, 40, 544}, {33, 140, 544}};
  for (const Shape& s : shapes) {
    const auto x = random_bf16(s.m * s.k, rng, 2.0f);
    const auto wf = random_bf16(s.n * s.k, rng, 0.05f);
    std::vector<uint16_t> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = f32_to_bf16_bits(wf[i]);
    const Bf16Weight w16{wb.data(), s.n, s.k};
    const F32Weight w32{wf.data(), s.n, s.k};
    std::vector<float> want16(s.m * s.n), want32(s.m * s.n);
    ref::linear_bf16(x.data(), s.m, w16, want16.data(), LinearOut::kF32);
    ref::linear_f32(x.data(), s.m, w32, want32.data());
    std::vector<double> abs_sum(s.m * s.n, 0.0);
    for (size_t i = 0; i < s.m; ++i)
      for (size_t j = 0; j < s.n; ++j)
        for (size_t c = 0; c < s.k; ++c) abs_sum[i * s.n + j] += std::fabs(static_cast<double>(x[i * s.k + c]) * wf[j * s.k + c]);
    // The references are the exact dot rounded once (one rounding); fast sums at most k terms.
    const double depth = static_cast<double>(s.k) + 1.0;
    for_each_kernel([&] {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> got16(s.m * s.n), got32(s.m * s.n), got16b(s.m * s.n);
        fast::linear_bf16(x.data(), s.m, w16, got16.data(), LinearOut::kF32, p);
        fast::linear_bf16(x.data(), s.m, w16, got16b.data(), LinearOut::kBf16, p);
        fast::linear_f32(x.data(), s.m, w32, got32.data(), p);
        for (size_t i = 0; i < s.m * s.n; ++i) {
          const double bound = 1.01 * depth * kU32 * abs_sum[i] + 1e-30;
          ASSERT_LE(std::fabs(static_cast<double>(got16[i]) - want16[i]), bound) << "bf16 m" << s.m << " k" << s.k << " @" << i;
          ASSERT_LE(std::fabs(static_cast<double>(got32[i]) - want32[i]), bound) << "f32 m" << s.m << " k" << s.k << " @" << i;
          ASSERT_EQ(got16b[i], round_bf16(got16[i])) << "bf16 output is the f32 result rounded once";
        }
      }
    });
  }
}

TEST(LinearFast, BatchedGemmsEqualSeparateOnesInBothModes) {
  // Three experts' worth of jobs with different row counts (GEMV and GEMM kernels) and widths that are
  // not multiples of the 16-row work unit: one parallel region must give each job's own results.
  std::mt19937 rng(21);
  ThreadPool pool(3);
  const Shape shapes[] = {{1, 40, 64}, {2, 70, 64}, {7, 33, 64}};
  for (Numerics mode : {Numerics::kExact, Numerics::kFast}) {
    const KernelSet& ks = kernel_set(mode);
    std::vector<BlockWeights> ws;
    std::vector<std::vector<float>> xs, scratches, want, got;
    std::vector<Fp4GemmJob> jobs;
    for (const Shape& s : shapes) {
      ws.push_back(random_block_weights(true, s.n, s.k, rng));
      xs.push_back(random_bf16(s.m * s.k, rng, 2.0f));
      scratches.emplace_back(ks.act_scratch_floats(s.m, s.k));
    }
    for (size_t j = 0; j < ws.size(); ++j) {
      const Fp8Activations a = ks.quantize_activations(xs[j].data(), shapes[j].m, shapes[j].k, scratches[j]);
      want.emplace_back(shapes[j].m * shapes[j].n);
      got.emplace_back(shapes[j].m * shapes[j].n, -1.0f);
      ks.gemm_fp4(a, ws[j].fp4w(), want[j].data(), nullptr);
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
  std::mt19937 rng(29);
  ThreadPool pool(3);
  const Shape shapes[] = {{1, 40, 64}, {1, 96, 128}, {2, 70, 64}, {7, 33, 96}};
  for (Numerics mode : {Numerics::kExact, Numerics::kFast}) {
    const KernelSet& ks = kernel_set(mode);
    for (auto kind : {Fp8LinearJob::Kind::kGemm, Fp8LinearJob::Kind::kAsBf16}) {
      std::vector<BlockWeights> ws;
      std::vector<std::vector<float>> xs, scratches, want, got;
      std::vector<Fp8LinearJob> jobs;
      for (const Shape& s : shapes) {
        ws.push_back(random_block_weights(false, s.n, s.k, rng));
        xs.push_back(random_bf16(s.m * s.k, rng, 2.0f));
        scratches.emplace_back(ks.act_scratch_floats(s.m, s.k));
      }
      for (size_t j = 0; j < ws.size(); ++j) {
        const Shape& s = shapes[j];
        want.emplace_back(s.m * s.n);
        got.emplace_back(s.m * s.n, -1.0f);
        if (kind == Fp8LinearJob::Kind::kGemm) {
          const Fp8Activations a = ks.quantize_activations_fp8(xs[j].data(), s.m, s.k, scratches[j]);
          ks.gemm_fp8(a, ws[j].fp8(), want[j].data(), nullptr);
          jobs.push_back({kind, a, ws[j].fp8(), got[j].data()});
        } else {
          ks.linear_fp8_bf16(xs[j].data(), s.m, ws[j].fp8(), want[j].data(), LinearOut::kBf16, nullptr);
          jobs.push_back({kind, Fp8Activations{xs[j].data(), nullptr, s.m, s.k}, ws[j].fp8(), got[j].data()});
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
        const Fp8Activations a = fast::quantize_activations(x.data() + row0, m, k, scratch);
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
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-140, 120);
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
      const Fp8Activations a = fast::quantize_activations(x.data(), m, k, scratch);
      for (size_t b = 0; b < m * k / 32; ++b) {
        const float want = fp8_block_scale(x.data() + b * 32);
        ASSERT_EQ(std::memcmp(&a.scales[b], &want, 4), 0) << "block " << b << ": " << a.scales[b] << " vs " << want;
      }
    });
  }
}

// The AVX512-VNNI kernel's byte planes: the vector packer writes the scalar reference's bytes and
// corrections, for plane values across their whole range and every block position in a row.
TEST(Fp4VnniPlanes, PackedBlocksEqualTheScalarPacker) {
  std::mt19937 rng(12);
  std::uniform_int_distribution<int32_t> value(-30720, 30720);
  const size_t kblocks = 19, padded = x86::fp4_vnni_padded_blocks(kblocks);
  std::vector<int8_t> want_plane(padded * 64), got_plane(padded * 64);
  std::vector<int32_t> want_corr(padded), got_corr(padded);
  for (int round = 0; round < 50; ++round) {
    for (size_t kb = 0; kb < kblocks; ++kb) {
      int32_t p[32];
      for (int32_t& v : p) v = value(rng);
      if (round == 0) p[kb % 32] = kb % 2 ? 30720 : -30720;  // the extremes
      if (round == 1) std::fill(p, p + 32, static_cast<int32_t>(kb % 2 ? 127 : -128));  // byte edges
      x86::fp4_vnni_pack_block_scalar(p, kb, want_plane.data(), want_corr.data());
      x86::fp4_vnni_pack_block(p, kb, got_plane.data(), got_corr.data());
    }
    ASSERT_EQ(got_plane, want_plane) << "round " << round;
    ASSERT_EQ(got_corr, want_corr) << "round " << round;
  }
}

// The bf16 form's activation layout: the vector packer writes the scalar reference's words, for
// widths with a short last group too, and both decline a nonzero value below 2^-125 or one that is not
// a bf16 number. The reference itself is checked against the layout's definition.
TEST(Fp4Bf16Plane, PackedRowsEqualTheScalarPacker) {
  std::mt19937 rng(14);
  std::uniform_int_distribution<int> code(0, 255), exponent(-20, 20);
  for (size_t k : {32, 96, 128, 160, 416, 5120}) {
    const size_t words = x86::fp4_bf16_plane_words(k);
    ASSERT_EQ(words % 128, 0u);
    ASSERT_GE(words, k);
    std::vector<float> v(k);
    for (auto& x : v) x = code(rng) % 7 == 0 ? 0.0f : std::ldexp(e4m3_to_f32(static_cast<uint8_t>(code(rng) & 0xFE)), exponent(rng));
    std::vector<uint16_t> want(words, 0xDEAD), got(words, 0xBEEF);
    ASSERT_TRUE(x86::fp4_bf16_pack_row_scalar(v.data(), k, want.data())) << k;
    ASSERT_TRUE(x86::fp4_bf16_pack_row(v.data(), k, got.data())) << k;
    ASSERT_EQ(got, want) << "k " << k;
    for (size_t j = 0; j < k; ++j) {
      const size_t g = j / 128, b = (j / 32) % 4, e = j % 32;
      ASSERT_EQ(bf16_bits_to_f32(want[g * 128 + (e % 4) * 32 + 8 * b + e / 4]), v[j]) << "k " << k << " @" << j;
    }
    for (size_t j = k; j < words; ++j) {
      const size_t g = j / 128, b = (j / 32) % 4, e = j % 32;
      ASSERT_EQ(want[g * 128 + (e % 4) * 32 + 8 * b + e / 4], 0) << "padding @" << j;
    }
    for (const float bad : {0x1p-126f, -0x1.8p-127f, 1.0f + 0x1p-10f}) {
      std::vector<float> w(v);
      w[k / 2] = bad;
      EXPECT_FALSE(x86::fp4_bf16_pack_row_scalar(w.data(), k, want.data())) << bad;
      EXPECT_FALSE(x86::fp4_bf16_pack_row(w.data(), k, got.data())) << bad;
    }
    std::vector<float> w(v);
    w[k - 1] = -0x1p-125f;  // the smallest magnitude taken
    EXPECT_TRUE(x86::fp4_bf16_pack_row(w.data(), k, got.data()));
  }
}

// FP4 weights of random codes with E8M0 scale 128 (2^1): every weight is an integer (E2M1 values
// are halves), so sums with integer activations stay exact in any order.
BlockWeights integer_fp4_weights(size_t n, size_t k, std::mt19937& rng) {
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
  std::mt19937 rng(33);
  const size_t n = 40, k = 256;
  const BlockWeights w = integer_fp4_weights(n, k, rng);
  std::vector<float> x(k, 0.0f);
  for (size_t j = 0; j < 32; ++j) x[64 + j] = std::ldexp(static_cast<float>(j % 8) * (j % 3 ? 1.0f : -1.0f), -31);
  std::vector<float> scratch(fast::act_scratch_floats(1, k));
  const Fp8Activations a = fast::quantize_activations(x.data(), 1, k, scratch);
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
  std::mt19937 rng(35);
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
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> small(-8, 8), sub(1, 7), pick(0, 3);
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
    const Fp8Activations a = fast::quantize_activations(x.data(), m, k, scratch);
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
  std::mt19937 rng(29);
  std::uniform_int_distribution<int> small(-8, 8);
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

// Checks a bf16-pair panel (gemm_bf16_x86.h: panel[(16 * b + i) * 16 + r] holds pair i of row r's
// block b) against the decoded values: want(r, b, i) gives the pair's two f32 values, computed from the
// format tables. Rows nr..15 must be zero.
template <typename Want>
void expect_panel_holds(const std::vector<uint32_t>& panel, size_t blocks, size_t nr, const Want& want) {
  for (size_t b = 0; b < blocks; ++b)
    for (size_t i = 0; i < 16; ++i)
      for (size_t r = 0; r < 16; ++r) {
        const uint32_t got = panel[(16 * b + i) * 16 + r];
        if (r >= nr) {
          ASSERT_EQ(got, 0u) << "nr " << nr << " row " << r;
          continue;
        }
        const auto [even, odd] = want(r, b, i);
        ASSERT_EQ(got & 0xFFFF, f32_to_bf16_bits(even)) << "row " << r << " block " << b << " pair " << i;
        ASSERT_EQ(got >> 16, f32_to_bf16_bits(odd)) << "row " << r << " block " << b << " pair " << i;
        // The values themselves (the bits of a bf16 number are its value's top half).
        ASSERT_EQ(bf16_bits_to_f32(static_cast<uint16_t>(got & 0xFFFF)), even);
        ASSERT_EQ(bf16_bits_to_f32(static_cast<uint16_t>(got >> 16)), odd);
      }
}

TEST(LinearFast, Fp4PanelsAsBf16PairsEqualTheDecodedValues) {
  // The prefill GEMM's direct FP4 -> bf16-pair panels (gemm_bf16_x86.h): 16 rows x 16 blocks in
  // which every row holds every byte value, at scales from the extremes the decode takes to 2^0,
  // full and short panels, against e2m1_table x e8m0_table; and the scales it must refuse.
  if (!x86::gemm_bf16_usable()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const size_t rows = 16, blocks = 16, row_bytes = blocks * 16;
  const int kScales[] = {2, 60, 126, 127, 128, 200, 252};
  std::vector<uint8_t> packed(rows * row_bytes), scales(rows * blocks);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t j = 0; j < row_bytes; ++j) packed[r * row_bytes + j] = static_cast<uint8_t>(j + 17 * r);
    for (size_t b = 0; b < blocks; ++b) scales[r * blocks + b] = static_cast<uint8_t>(kScales[(r + 3 * b) % 7]);
  }
  for (size_t nr : {size_t{16}, size_t{5}, size_t{1}}) {
    std::vector<uint32_t> panel(blocks * 16 * 16, 0xDEADBEEF);
    int lo = 255, hi = 0;
    ASSERT_TRUE(x86::fp4_panel_bf16_pairs(packed.data(), row_bytes, scales.data(), blocks, nr, blocks, panel.data(),
                                          &lo, &hi));
    int s_lo = 255, s_hi = 0;
    for (size_t r = 0; r < nr; ++r)
      for (size_t b = 0; b < blocks; ++b) {
        s_lo = std::min<int>(s_lo, scales[r * blocks + b]);
        s_hi = std::max<int>(s_hi, scales[r * blocks + b]);
      }
    EXPECT_EQ(lo, s_lo - 1);
    EXPECT_EQ(hi, s_hi + 2);
    expect_panel_holds(panel, blocks, nr, [&](size_t r, size_t b, size_t i) {
      const uint8_t byte = packed[r * row_bytes + 16 * b + i];
      const float s = e8m0_table()[scales[r * blocks + b]];
      return std::pair{e2m1_table()[byte & 15] * s, e2m1_table()[byte >> 4] * s};
    });
  }
  for (int scale : {0, 1, 253, 254, 255}) {
    std::vector<uint8_t> bad = scales;
    bad[7 * blocks + 9] = static_cast<uint8_t>(scale);
    std::vector<uint32_t> panel(blocks * 16 * 16);
    int lo = 255, hi = 0;
    EXPECT_FALSE(x86::fp4_panel_bf16_pairs(packed.data(), row_bytes, bad.data(), blocks, 16, blocks, panel.data(), &lo,
                                           &hi))
        << scale;
  }
}

TEST(LinearFast, Fp8PanelsAsBf16PairsEqualTheDecodedValues) {
  // The prefill GEMM's direct FP8 -> bf16-pair panels (gemm_bf16_x86.h, AVX512-VBMI): 16 rows of 9
  // blocks (an odd count: the last block alone) in which every row holds every non-NaN code, at
  // scales from the extremes the decode takes to 2^0, full and short panels, against e4m3_table x
  // e8m0_table; and the scales and NaN codes it must refuse.
  if (!x86::gemm_bf16_usable() || !x86::has_avx512_bf16_vbmi()) GTEST_SKIP() << "no AVX512-BF16 + VBMI";
  const size_t rows = 16, blocks = 9, k = 32 * blocks;
  const int kScales[] = {10, 60, 127, 200, 246};
  std::vector<uint8_t> codes(rows * k), scales(blocks);
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < k; ++j) {
      const uint8_t c = static_cast<uint8_t>(j + 37 * r);
      codes[r * k + j] = (c & 0x7F) == 0x7F ? static_cast<uint8_t>(c - 1) : c;  // NaN codes: their neighbours
    }
  for (size_t b = 0; b < blocks; ++b) scales[b] = static_cast<uint8_t>(kScales[b % 5]);
  for (size_t nr : {size_t{16}, size_t{7}, size_t{1}}) {
    std::vector<uint32_t> panel(blocks * 16 * 16, 0xDEADBEEF);
    int lo = 255, hi = 0;
    ASSERT_TRUE(x86::fp8_panel_bf16_pairs(codes.data(), k, scales.data(), nr, blocks, panel.data(), &lo, &hi));
    EXPECT_EQ(lo, 10 - 9);
    EXPECT_EQ(hi, 246 + 8);
    expect_panel_holds(panel, blocks, nr, [&](size_t r, size_t b, size_t i) {
      const float s = e8m0_table()[scales[b]];
      const uint8_t* pair = codes.data() + r * k + 32 * b + 2 * i;
      return std::pair{e4m3_table()[pair[0]] * s, e4m3_table()[pair[1]] * s};
    });
  }
  std::vector<uint32_t> panel(blocks * 16 * 16);
  for (int scale : {0, 9, 247, 255}) {
    std::vector<uint8_t> bad = scales;
    bad[4] = static_cast<uint8_t>(scale);
    int lo = 255, hi = 0;
    EXPECT_FALSE(x86::fp8_panel_bf16_pairs(codes.data(), k, bad.data(), 16, blocks, panel.data(), &lo, &hi)) << scale;
  }
  for (uint8_t nan : {uint8_t{0x7F}, uint8_t{0xFF}}) {
    std::vector<uint8_t> bad = codes;
    bad[5 * k + 200] = nan;
    int lo = 255, hi = 0;
    EXPECT_FALSE(x86::fp8_panel_bf16_pairs(bad.data(), k, scales.data(), 16, blocks, panel.data(), &lo, &hi));
  }
}

TEST(LinearFast, Fp8WeightAsBf16EqualsTheDequantisedWeight) {
  // wo_a: the FP8 weight read as its bf16 dequantisation. Exact mode must equal linear_bf16 on the
  // dequantised copy bit for bit (the goldens' contract); fast mode must stay within the fp32
  // summation bound of it. Shapes: GEMV and GEMM row counts, rows not a multiple of 16 or 32.
  std::mt19937 rng(23);
  ThreadPool pool(3);
  const Shape shapes[] = {{1, 64, 256}, {3, 45, 96}, {7, 70, 128}, {1, 100, 64}};
  for (const Shape& s : shapes) {
    const auto x = random_bf16(s.m * s.k, rng, 2.0f);
    const BlockWeights w = random_block_weights(false, s.n, s.k, rng);
    std::vector<uint16_t> bits(s.n * s.k);
    dequantize_fp8_weight_to_bf16(w.fp8(), bits.data());
    std::vector<float> want(s.m * s.n), want_f32(s.m * s.n);
    linear_bf16(x.data(), s.m, Bf16Weight{bits.data(), s.n, s.k}, want.data(), LinearOut::kBf16, nullptr);
    linear_bf16(x.data(), s.m, Bf16Weight{bits.data(), s.n, s.k}, want_f32.data(), LinearOut::kF32, nullptr);
    std::vector<double> abs_sum(s.m * s.n, 0.0);
    for (size_t i = 0; i < s.m; ++i)
      for (size_t j = 0; j < s.n; ++j)
        for (size_t c = 0; c < s.k; ++c) abs_sum[i * s.n + j] += std::fabs(x[i * s.k + c] * w.value(j, c));
    for_each_kernel([&] {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> exact(s.m * s.n), fastv(s.m * s.n), exact_f32(s.m * s.n);
        linear_fp8_bf16(x.data(), s.m, w.fp8(), exact.data(), LinearOut::kBf16, p);
        linear_fp8_bf16(x.data(), s.m, w.fp8(), exact_f32.data(), LinearOut::kF32, p);
        fast::linear_fp8_bf16(x.data(), s.m, w.fp8(), fastv.data(), LinearOut::kBf16, p);
        for (size_t i = 0; i < s.m * s.n; ++i) {
          ASSERT_EQ(std::memcmp(&exact[i], &want[i], 4), 0) << "m" << s.m << " n" << s.n << " @" << i;
          ASSERT_EQ(std::memcmp(&exact_f32[i], &want_f32[i], 4), 0) << "f32 out, m" << s.m << " @" << i;
          const double bound = 1.01 * ((s.k + 1.0) * kU32 * abs_sum[i] +
                                       kUBf16 * (std::fabs(static_cast<double>(fastv[i])) + std::fabs(want[i]))) +
                               1e-30;
          ASSERT_LE(std::fabs(static_cast<double>(fastv[i]) - want[i]), bound) << "fast m" << s.m << " @" << i;
        }
      }
    });
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

TEST(LinearFast, Fp8GemvBf16DeclinesActivationsItCannotTakeExactly) {
  if (!x86::fp8_gemv_bf16_usable()) GTEST_SKIP() << "this CPU lacks AVX512-VBMI or AVX512-BF16";
  // Three 32-row groups; the middle one's weight scale (2^-125) scales the activations below 2^-117,
  // where vdpbf16ps would flush products: the kernel must stop there and leave the group to the caller.
  std::mt19937 rng(31);
  const size_t n = 96, k = 128;
  const BlockWeights w = [&] {
    BlockWeights b = random_block_weights(false, n, k, rng);
    for (size_t kb = 0; kb < k / 32; ++kb) b.scales[1 * (k / 32) + kb] = 2;
    return b;
  }();
  const auto x = random_bf16(k, rng, 2.0f);
  std::vector<float> scratch(fast::act_scratch_floats(1, k));
  const Fp8Activations a = fast::quantize_activations(x.data(), 1, k, scratch);
  std::vector<float> y(n, -1.0f);
  EXPECT_EQ(x86::fp8_gemv_bf16(a.values, 1, w.data.data(), w.scales.data(), n, k, y.data(), 0, n), 32u);
  EXPECT_EQ(x86::fp8_gemv_bf16(a.values, 1, w.data.data(), w.scales.data(), n, k, y.data(), 40, n), 40u);
  EXPECT_EQ(x86::fp8_gemv_bf16(a.values, 1, w.data.data(), w.scales.data(), n, k, y.data(), 64, n), n);
  EXPECT_EQ(y[40], -1.0f) << "a declined group is left untouched";
  // Scaled activations of 256 and above: times 2^120 they would pass bf16's largest number (2^128 less
  // a 256th), so the arithmetic decode's activations could not hold them. With scale 1, 300 is declined
  // and 255 (whose 2^120 multiple is bf16's largest) is taken.
  {
    BlockWeights unit = w;
    std::fill(unit.scales.begin(), unit.scales.end(), uint8_t{127});
    std::vector<float> act(a.values, a.values + k);
    act[3] = 300.0f;
    EXPECT_EQ(x86::fp8_gemv_bf16(act.data(), 1, unit.data.data(), unit.scales.data(), n, k, y.data(), 0, n), 0u);
    act[3] = 255.0f;
    EXPECT_EQ(x86::fp8_gemv_bf16(act.data(), 1, unit.data.data(), unit.scales.data(), n, k, y.data(), 0, n), n);
  }
  // Non-finite activations: every group is declined (the caller's kernel propagates them).
  {
    std::vector<float> nan_x(a.values, a.values + k);
    nan_x[70] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(x86::fp8_gemv_bf16(nan_x.data(), 1, w.data.data(), w.scales.data(), n, k, y.data(), 64, n), 64u);
    nan_x[70] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(x86::fp8_gemv_bf16(nan_x.data(), 1, w.data.data(), w.scales.data(), n, k, y.data(), 64, n), 64u);
  }
  // Activations that are not bf16 values (wo_a reads x unquantised) are declined from the start.
  std::vector<float> not_bf16(x);
  not_bf16[5] = std::nextafter(not_bf16[5], 100.0f);
  EXPECT_EQ(x86::fp8_gemv_bf16(not_bf16.data(), 1, w.data.data(), w.scales.data(), n, k, y.data(), 0, n), 0u);
  // Through the public entry, the declined rows come out exactly as the Highway kernel computes them.
  std::vector<float> with(n), without(n);
  fast::linear_fp8(x.data(), 1, w.fp8(), with.data(), scratch, nullptr);
  x86::set_fp8_gemv_bf16_allowed(false);
  fast::linear_fp8(x.data(), 1, w.fp8(), without.data(), scratch, nullptr);
  x86::set_fp8_gemv_bf16_allowed(true);
  for (size_t i = 32; i < 64; ++i) ASSERT_EQ(std::memcmp(&with[i], &without[i], 4), 0) << "row " << i;
}

TEST(LinearFast, KernelSetsSelectTheirMode) {
  EXPECT_EQ(kernel_set(Numerics::kExact).linear_fp4, &linear_fp4);
  EXPECT_EQ(kernel_set(Numerics::kFast).linear_fp4, &fast::linear_fp4);
  EXPECT_EQ(parse_numerics("fast"), Numerics::kFast);
  EXPECT_EQ(parse_numerics("exact"), Numerics::kExact);
  EXPECT_FALSE(parse_numerics("fastest").has_value());
  // An exact-mode activation view is refused by the fast GEMMs instead of being misread.
  std::vector<float> x(64, 1.0f), scratch(fp8_act_scratch_floats(1, 64)), y(1);
  const Fp8Activations exact_a = quantize_activations(x.data(), 1, 64, scratch);
  std::vector<uint8_t> codes(64, 0x38), scales(2, 127);
  EXPECT_DEATH(fast::gemm_fp8(exact_a, Fp8Weight{codes.data(), scales.data(), 1, 64}, y.data(), nullptr),
               "fast::quantize_activations");
}

}  // namespace
}  // namespace cedar::ops
