// The fast linears over dense weights (ops/linear/linear_fast.h: linear_bf16, linear_f32, and the FP8 weight
// read as bf16, linear_fp8_bf16) against the references, on every compiled SIMD target and x86
// kernel variant: the derived fp32-summation bound of docs/NUMERICS.md ("Fast numerics"), bf16 output
// as the f32 result rounded once, results independent of the thread count.
#include "ops/linear/linear_fast.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "ops/formats/formats.h"
#include "ops/linear/linear.h"
#include "ops/formats/quant.h"
#include "ops_test_util.h"
#include "simd_targets.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h and simd_targets.h

// Activations that are not bf16 values (full fp32 mantissas; a kernel that truncated them to bf16
// would be off by up to 2^-8) still give the fp32-accumulation bound of the exact dot.
TEST(LinearFast, Bf16WeightsWithFp32ActivationsStayWithinTheBound) {
  Rng rng(11);
  Normal normal(0.0f, 1.0f);
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
  Rng rng(7);
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

TEST(LinearFast, Fp8WeightAsBf16EqualsTheDequantisedWeight) {
  // wo_a: the FP8 weight read as its bf16 dequantisation. Exact mode must equal linear_bf16 on the
  // dequantised copy bit for bit (the goldens' contract); fast mode must stay within the fp32
  // summation bound of it. Shapes: GEMV and GEMM row counts, rows not a multiple of 16 or 32.
  Rng rng(23);
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

}  // namespace
}  // namespace cedar::ops
