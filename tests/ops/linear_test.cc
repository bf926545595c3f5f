// Linear kernels: hand-worked values, the scalar references against the numerics contract restated
// with exact integer arithmetic (docs/NUMERICS.md §1: exact sums rounded once), and every SIMD target
// bit-identical to the references.
#include "ops/linear/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "ops/linear/activation_access.h"
#include "ops/formats/formats.h"
#include "ops/formats/quant.h"
#include "ops_test_util.h"
#include "simd_targets.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h and simd_targets.h

TEST(LinearFp8, HandWorked) {
  // x = 1 everywhere: act scale 2^ceil(log2(1/448)) = 2^-8, codes 256. Weights 0.5 (code 0x30) with
  // scale 2^3 (E8M0 130) for output 0 and 2^0 for output 1 (rows 0..31 share a scale row, so use
  // n = 33 and look at rows 0 and 32).
  const size_t n = 33, k = 64;
  std::vector<float> x(k, 1.0f);
  std::vector<uint8_t> codes(n * k, 0x30);
  std::vector<uint8_t> scales = {130, 130, 127, 127};  // [2 row blocks, 2 col blocks]
  std::vector<float> scratch(fp8_act_scratch_floats(1, k));
  std::vector<float> y(n);
  linear_fp8(x.data(), 1, Fp8Weight{codes.data(), scales.data(), n, k}, y.data(), scratch, nullptr);
  // Σ 64 * (256 * 0.5) * 2^-8 * 2^3 = 64 * 0.5 * 8 = 256; row 32: 64 * 0.5 = 32.
  EXPECT_EQ(y[0], 256.0f);
  EXPECT_EQ(y[31], 256.0f);
  EXPECT_EQ(y[32], 32.0f);
}

TEST(LinearFp4, HandWorked) {
  // x = 2 everywhere (act scale 2^ceil(log2(2/448)) = 2^-7, codes 256); weights alternate 1.5 (code
  // 3, low nibble) and -6 (code 0xF, high nibble); per-row scale 2^-1.
  const size_t n = 2, k = 32;
  std::vector<float> x(k, 2.0f);
  std::vector<uint8_t> packed(n * k / 2, 0xF3);
  std::vector<uint8_t> scales(n * k / 32, 126);
  std::vector<float> scratch(fp8_act_scratch_floats(1, k));
  std::vector<float> y(n);
  linear_fp4(x.data(), 1, Fp4Weight{packed.data(), scales.data(), n, k}, y.data(), scratch, nullptr);
  // 16 * 2 * (1.5 - 6) * 0.5 = -72
  EXPECT_EQ(y[0], -72.0f);
  EXPECT_EQ(y[1], -72.0f);
}

TEST(LinearFp8, QuantizedActivationsMatchActQuant) {
  Rng rng(1);
  const size_t m = 3, k = 96;
  auto x = random_bf16(m * k, rng, 3.0f);
  std::vector<float> scratch(fp8_act_scratch_floats(m, k));
  const ActivationLayout a = ActivationAccess::layout(quantize_activations(x.data(), m, k, scratch));
  std::vector<uint8_t> codes(m * k), sc(m * k / 32);
  act_quant_fp8(x.data(), m * k, codes.data(), sc.data());
  for (size_t i = 0; i < m * k; ++i) ASSERT_EQ(a.values[i], e4m3_to_f32(codes[i]));
  for (size_t i = 0; i < m * k / 32; ++i) ASSERT_EQ(a.scales[i], e8m0_to_f32(sc[i]));
}

// Integer multiples of 2^-9 (E4M3 values) and 2^-1 (E2M1 values), exactly.
int64_t e4m3_units(uint8_t code) { return static_cast<int64_t>(std::ldexp(e4m3_to_f32(code), 9)); }
int64_t e2m1_units(uint8_t code) { return static_cast<int64_t>(std::ldexp(e2m1_to_f32(code), 1)); }

// The contract for one block-scaled output, restated with integers: the block sum of products is an
// exact int64 count of 2^-shift units, converted to fp32 with one rounding (int64 -> long double is
// exact below 2^63, long double -> float rounds once), then scaled by powers of two and accumulated
// in fp32 in K order, bf16 at the end.
float contract_block_output(const ActivationLayout& a, size_t row, size_t k, int shift,
                            const std::function<int64_t(size_t)>& weight_units,
                            const std::function<float(size_t)>& weight_scale) {
  float acc = 0.0f;
  for (size_t kb = 0; kb < k / 32; ++kb) {
    int64_t units = 0;
    for (size_t j = kb * 32; j < kb * 32 + 32; ++j) {
      const int64_t au = static_cast<int64_t>(std::ldexp(a.values[row * k + j], 9));
      units += au * weight_units(j);
    }
    const float part = std::ldexp(static_cast<float>(static_cast<long double>(units)), -shift);
    acc += (part * a.scales[row * (k / 32) + kb]) * weight_scale(kb);
  }
  return round_bf16(acc);
}

TEST(LinearRef, BlockGemmsFollowTheContractExactly) {
  Rng rng(2);
  const size_t m = 4, n = 40, k = 256;
  auto x = random_bf16(m * k, rng, 2.0f);
  for (size_t i = 0; i < x.size(); i += 7) x[i] = round_bf16(x[i] * 0x1p-12f);  // wide in-block spans
  std::vector<float> scratch(fp8_act_scratch_floats(m, k));
  const PreparedActivations a = quantize_activations(x.data(), m, k, scratch);
  const BlockWeights w8 = random_fp8_weights(n, k, rng);
  const BlockWeights w4 = random_fp4_weights(n, k, rng);
  std::vector<float> y8(m * n), y4(m * n);
  ref::gemm_fp8(a, w8.fp8(), y8.data());
  ref::gemm_fp4(a, w4.fp4w(), y4.data());
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      const float want8 = contract_block_output(
          ActivationAccess::layout(a), i, k, 18, [&](size_t kk) { return e4m3_units(w8.data[j * k + kk]); },
          [&](size_t kb) { return e8m0_to_f32(w8.scales[(j / 32) * (k / 32) + kb]); });
      const float want4 = contract_block_output(
          ActivationAccess::layout(a), i, k, 10,
          [&](size_t kk) {
            const uint8_t byte = w4.data[j * (k / 2) + kk / 2];
            return e2m1_units((kk & 1) ? (byte >> 4) : (byte & 0xF));
          },
          [&](size_t kb) { return e8m0_to_f32(w4.scales[j * (k / 32) + kb]); });
      ASSERT_EQ(bits_of(y8[i * n + j]), bits_of(want8)) << i << "," << j;
      ASSERT_EQ(bits_of(y4[i * n + j]), bits_of(want4)) << i << "," << j;
    }
  }
}

// A block whose fp32 running sum loses the small product in any order that adds it to a large one
// first: products 448^2 (element 0), 2^-18 (element 8), -448^2 (element 16). The exact sum is 2^-18;
// a sequential or lane-chained fp32 sum gives 0.
TEST(LinearFp8, BlockSumIsExactBeforeItsOneRounding) {
  const size_t k = 32;
  std::vector<float> values(k, 0.0f), scales(1, 1.0f);
  values[0] = 448.0f;
  values[8] = 0x1p-9f;
  values[16] = 448.0f;
  const PreparedActivations a = ActivationAccess::wrap({values.data(), scales.data(), 1, k});
  std::vector<uint8_t> codes(k, 0x00), wscale(1, 127);
  codes[0] = 0x7E;   // +448
  codes[8] = 0x01;   // 2^-9 (smallest subnormal)
  codes[16] = 0xFE;  // -448
  float fp32_chain = 0.0f;
  for (int e : {0, 8, 16}) fp32_chain += values[e] * e4m3_to_f32(codes[e]);
  ASSERT_EQ(fp32_chain, 0.0f);  // what an fp32 accumulator would give
  float want;
  ref::gemm_fp8(a, Fp8Weight{codes.data(), wscale.data(), 1, k}, &want);
  EXPECT_EQ(want, 0x1p-18f);
  for_each_simd_target([&] {
    float got = -1.0f;
    gemm_fp8(a, Fp8Weight{codes.data(), wscale.data(), 1, k}, &got, nullptr);
    EXPECT_EQ(got, 0x1p-18f);
  });
}

TEST(LinearSimd, BlockGemmsBitIdenticalToReferenceOnEveryTarget) {
  struct Shape {
    size_t m, n, k;
  };
  // m = 1..3 take the row-by-row path, m >= 4 the 16-row tiles (with a partial last tile).
  const Shape shapes[] = {{1, 37, 96},   {1, 100, 256}, {3, 20, 64}, {5, 33, 160},
                          {17, 70, 128}, {1, 64, 1024}, {40, 50, 96}};
  Rng rng(3);
  for (const Shape& s : shapes) {
    auto x = random_bf16(s.m * s.k, rng, 4.0f);
    const BlockWeights w8 = random_fp8_weights(s.n, s.k, rng);
    const BlockWeights w4 = random_fp4_weights(s.n, s.k, rng);
    std::vector<float> scratch(fp8_act_scratch_floats(s.m, s.k));
    const PreparedActivations a = quantize_activations(x.data(), s.m, s.k, scratch);
    std::vector<float> want8(s.m * s.n), want4(s.m * s.n);
    ref::gemm_fp8(a, w8.fp8(), want8.data());
    ref::gemm_fp4(a, w4.fp4w(), want4.data());
    ThreadPool pool(3);
    for_each_simd_target([&] {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> got8(s.m * s.n), got4(s.m * s.n);
        std::vector<float> scratch2(fp8_act_scratch_floats(s.m, s.k));
        linear_fp8(x.data(), s.m, w8.fp8(), got8.data(), scratch2, p);
        linear_fp4(x.data(), s.m, w4.fp4w(), got4.data(), scratch2, p);
        for (size_t i = 0; i < s.m * s.n; ++i) {
          ASSERT_EQ(bits_of(got8[i]), bits_of(want8[i]))
              << "fp8 m" << s.m << " n" << s.n << " k" << s.k << " @" << i;
          ASSERT_EQ(bits_of(got4[i]), bits_of(want4[i]))
              << "fp4 m" << s.m << " n" << s.n << " k" << s.k << " @" << i;
        }
      }
    });
  }
}

TEST(LinearSimd, ExtremeCodesAndScalesStayExact) {
  // Subnormal E4M3 weights and activations, the largest codes, and scales from 2^-40 to 2^40: the
  // scaled-exponent decoding of the fast path must still give the reference bits.
  Rng rng(4);
  const size_t m = 6, n = 64, k = 128;  // m >= kActTileMinRows: the row-tiled path
  std::vector<float> x(m * k);
  UniformInt<int> pick(0, 3);
  for (auto& v : x) {
    const int p = pick(rng);
    v = p == 0 ? 0x1p-20f : (p == 1 ? -3.0e4f : (p == 2 ? 0.0f : round_bf16(0.37f)));
  }
  BlockWeights w8 = random_fp8_weights(n, k, rng);
  for (size_t i = 0; i < w8.data.size(); i += 3) w8.data[i] = static_cast<uint8_t>(i % 8);  // subnormals
  for (size_t i = 0; i < w8.scales.size(); ++i) w8.scales[i] = static_cast<uint8_t>(i % 2 ? 87 : 167);
  BlockWeights w4 = random_fp4_weights(n, k, rng);
  for (size_t i = 0; i < w4.scales.size(); ++i) w4.scales[i] = static_cast<uint8_t>(i % 2 ? 87 : 167);
  std::vector<float> scratch(fp8_act_scratch_floats(m, k));
  const PreparedActivations a = quantize_activations(x.data(), m, k, scratch);
  std::vector<float> want8(m * n), want4(m * n);
  ref::gemm_fp8(a, w8.fp8(), want8.data());
  ref::gemm_fp4(a, w4.fp4w(), want4.data());
  ASSERT_NE(ActivationAccess::layout(a).values_t, nullptr);
  PreparedActivations untiled = a;  // the same operands through the row-by-row path
  ActivationAccess::layout(untiled).values_t = nullptr;
  ActivationAccess::layout(untiled).scales_t = nullptr;
  for_each_simd_target([&] {
    for (const PreparedActivations* act : {&a, static_cast<const PreparedActivations*>(&untiled)}) {
      std::vector<float> got8(m * n), got4(m * n);
      gemm_fp8(*act, w8.fp8(), got8.data(), nullptr);
      gemm_fp4(*act, w4.fp4w(), got4.data(), nullptr);
      for (size_t i = 0; i < m * n; ++i) {
        ASSERT_EQ(bits_of(got8[i]), bits_of(want8[i])) << i;
        ASSERT_EQ(bits_of(got4[i]), bits_of(want4[i])) << i;
      }
    }
  });
}

// Values m * 2^(exponent + s) with |m| < 2^bits and s in [0, spread]: every product and sum below is an
// exact integer count of 2^exponent units.
std::vector<float> grid_values(size_t n, Rng& rng, int bits, int exponent, int spread = 0) {
  UniformInt<int32_t> mant(-(1 << bits) + 1, (1 << bits) - 1);
  UniformInt<int> shift(0, spread);
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(static_cast<float>(mant(rng)), exponent + shift(rng));
  return v;
}

// The contract's dense dot is the exact sum rounded once. Inputs on a fixed grid make the exact sum an
// integer count of units (__int128, exact), which long double holds exactly below 2^64 and rounds once
// to fp32. The data spans far more than 24 bits, so an fp32 accumulator would round many times.
TEST(LinearDense, EqualsCorrectlyRoundedExactDot) {
  Rng rng(5);
  const size_t m = 3, n = 20, k = 1000;
  // bf16 x bf16: 8-bit mantissas on the grids 2^-4 (spread over 12 binades) and 2^-6, products on
  // 2^-10, sums up to ~2^44 units.
  const auto x = grid_values(m * k, rng, 8, -4, 12);
  const auto wf = grid_values(n * k, rng, 8, -6);
  // fp32 weights with 20-bit mantissas on 2^-24 (genuinely fp32: the products need 28 bits).
  const auto w32 = grid_values(n * k, rng, 20, -24);
  std::vector<uint16_t> wb(n * k);
  f32_to_bf16(wf.data(), wb.data(), wb.size());
  for (size_t i = 0; i < n * k; ++i) ASSERT_EQ(bf16_bits_to_f32(wb[i]), wf[i]);
  std::vector<float> y32(m * n), y16(m * n), yf(m * n);
  ref::linear_bf16(x.data(), m, Bf16Weight{wb.data(), n, k}, y32.data(), LinearOut::kF32);
  ref::linear_bf16(x.data(), m, Bf16Weight{wb.data(), n, k}, y16.data(), LinearOut::kBf16);
  ref::linear_f32(x.data(), m, F32Weight{w32.data(), n, k}, yf.data());
  size_t fp32_accumulator_differs = 0;
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      __int128 units16 = 0, units32 = 0;
      float fp32_acc = 0.0f;
      for (size_t kk = 0; kk < k; ++kk) {
        const auto xu = static_cast<int64_t>(std::ldexp(x[i * k + kk], 4));
        units16 += xu * static_cast<int64_t>(std::ldexp(wf[j * k + kk], 6));
        units32 += static_cast<__int128>(xu) * static_cast<int64_t>(std::ldexp(w32[j * k + kk], 24));
        fp32_acc += x[i * k + kk] * wf[j * k + kk];
      }
      const float want16 = std::ldexp(static_cast<float>(static_cast<long double>(units16)), -10);
      const float want32 = std::ldexp(static_cast<float>(static_cast<long double>(units32)), -28);
      EXPECT_EQ(y32[i * n + j], want16) << i << "," << j;
      EXPECT_EQ(y16[i * n + j], round_bf16(want16)) << i << "," << j;
      EXPECT_EQ(yf[i * n + j], want32) << i << "," << j;
      fp32_accumulator_differs += fp32_acc != want16;
    }
  }
  EXPECT_GT(fp32_accumulator_differs, 0u);  // the data does discriminate the contract from fp32 sums
}

TEST(LinearSimd, DenseBitIdenticalToReferenceOnEveryTarget) {
  Rng rng(6);
  for (size_t k : {7u, 64u, 100u, 1000u}) {
    const size_t m = 3, n = 70;
    auto x = random_bf16(m * k, rng);
    auto wf = random_bf16(n * k, rng);
    std::vector<float> wf32(n * k);
    Normal normal;
    for (auto& v : wf32) v = normal(rng);  // genuine f32 weights: products need more than 24 bits
    std::vector<uint16_t> wb(n * k);
    f32_to_bf16(wf.data(), wb.data(), wb.size());
    std::vector<float> want16(m * n), want32(m * n), wantf(m * n);
    ref::linear_bf16(x.data(), m, Bf16Weight{wb.data(), n, k}, want16.data(), LinearOut::kBf16);
    ref::linear_bf16(x.data(), m, Bf16Weight{wb.data(), n, k}, want32.data(), LinearOut::kF32);
    ref::linear_f32(x.data(), m, F32Weight{wf32.data(), n, k}, wantf.data());
    ThreadPool pool(2);
    for_each_simd_target([&] {
      std::vector<float> g16(m * n), g32(m * n), gf(m * n);
      linear_bf16(x.data(), m, Bf16Weight{wb.data(), n, k}, g16.data(), LinearOut::kBf16, &pool);
      linear_bf16(x.data(), m, Bf16Weight{wb.data(), n, k}, g32.data(), LinearOut::kF32, nullptr);
      linear_f32(x.data(), m, F32Weight{wf32.data(), n, k}, gf.data(), &pool);
      for (size_t i = 0; i < m * n; ++i) {
        ASSERT_EQ(bits_of(g16[i]), bits_of(want16[i])) << "k " << k << " @" << i;
        ASSERT_EQ(bits_of(g32[i]), bits_of(want32[i])) << "k " << k << " @" << i;
        ASSERT_EQ(bits_of(gf[i]), bits_of(wantf[i])) << "k " << k << " @" << i;
      }
    });
  }
}

TEST(LinearFp8, DequantizeToBf16IsExact) {
  Rng rng(7);
  const size_t n = 40, k = 64;
  const BlockWeights w = random_fp8_weights(n, k, rng);
  std::vector<uint16_t> out(n * k);
  dequantize_fp8_weight_to_bf16(w.fp8(), out.data());
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < k; ++j) {
      const double v = static_cast<double>(e4m3_to_f32(w.data[i * k + j])) *
                       e8m0_to_f32(w.scales[(i / 32) * (k / 32) + j / 32]);
      ASSERT_EQ(static_cast<double>(bf16_bits_to_f32(out[i * k + j])), v);
    }
  }
}

}  // namespace
}  // namespace cedar::ops
