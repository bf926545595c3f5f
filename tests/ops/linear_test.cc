// Linear kernels: hand-worked values, the scalar references against exact (double) arithmetic, and
// every SIMD target bit-identical to the references (same canonical orders).
#include "ops/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "ops/formats.h"
#include "ops/quant.h"
#include "simd_targets.h"

namespace cedar::ops {
namespace {

using testing::for_each_simd_target;

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

std::vector<float> random_bf16(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(normal(rng));
  return v;
}

struct Fp8Data {
  std::vector<uint8_t> codes, scales;
  Fp8Weight view(size_t n, size_t k) const { return {codes.data(), scales.data(), n, k}; }
};
Fp8Data random_fp8(size_t n, size_t k, std::mt19937& rng) {
  Fp8Data d;
  std::uniform_int_distribution<int> code(0, 255), sc(117, 130);
  d.codes.resize(n * k);
  for (auto& c : d.codes) {
    do c = static_cast<uint8_t>(code(rng));
    while ((c & 0x7F) == 0x7F);  // no NaN codes in real weights
  }
  d.scales.resize(((n + 31) / 32) * ((k + 31) / 32));
  for (auto& s : d.scales) s = static_cast<uint8_t>(sc(rng));
  return d;
}

struct Fp4Data {
  std::vector<uint8_t> packed, scales;
  Fp4Weight view(size_t n, size_t k) const { return {packed.data(), scales.data(), n, k}; }
};
Fp4Data random_fp4(size_t n, size_t k, std::mt19937& rng) {
  Fp4Data d;
  std::uniform_int_distribution<int> byte(0, 255), sc(117, 130);
  d.packed.resize(n * k / 2);
  for (auto& b : d.packed) b = static_cast<uint8_t>(byte(rng));
  d.scales.resize(n * (k / 32));
  for (auto& s : d.scales) s = static_cast<uint8_t>(sc(rng));
  return d;
}

float bf16_ulp(float v) {
  const float a = std::fabs(v);
  if (a < 0x1p-126f) return 0x1p-133f;
  return std::exp2(std::floor(std::log2(a)) - 7);
}

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
  std::mt19937 rng(1);
  const size_t m = 3, k = 96;
  auto x = random_bf16(m * k, rng, 3.0f);
  std::vector<float> scratch(fp8_act_scratch_floats(m, k));
  const Fp8Activations a = quantize_activations(x.data(), m, k, scratch);
  std::vector<uint8_t> codes(m * k), sc(m * k / 32);
  act_quant_fp8(x.data(), m * k, codes.data(), sc.data());
  for (size_t i = 0; i < m * k; ++i) ASSERT_EQ(a.values[i], e4m3_to_f32(codes[i]));
  for (size_t i = 0; i < m * k / 32; ++i) ASSERT_EQ(a.scales[i], e8m0_to_f32(sc[i]));
}

// The reference GEMMs against exact double arithmetic on the same quantised operands: the only
// roundings are the f32 in-block sum, the f32 block accumulation and the final bf16 cast, so the
// result is within one bf16 ulp (plus the tiny f32 error) of bf16(exact).
TEST(LinearRef, BlockGemmsAgreeWithExactArithmetic) {
  std::mt19937 rng(2);
  const size_t m = 4, n = 40, k = 256;
  auto x = random_bf16(m * k, rng, 2.0f);
  std::vector<float> scratch(fp8_act_scratch_floats(m, k));
  const Fp8Activations a = quantize_activations(x.data(), m, k, scratch);
  const Fp8Data w8 = random_fp8(n, k, rng);
  const Fp4Data w4 = random_fp4(n, k, rng);
  std::vector<float> y8(m * n), y4(m * n);
  ref::gemm_fp8(a, w8.view(n, k), y8.data());
  ref::gemm_fp4(a, w4.view(n, k), y4.data());
  size_t equal = 0;
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      double e8 = 0, e4 = 0, mag8 = 0, mag4 = 0;
      for (size_t kk = 0; kk < k; ++kk) {
        const double av = static_cast<double>(a.values[i * k + kk]) * a.scales[i * (k / 32) + kk / 32];
        const double w8v = static_cast<double>(e4m3_to_f32(w8.codes[j * k + kk])) *
                           e8m0_to_f32(w8.scales[(j / 32) * (k / 32) + kk / 32]);
        const uint8_t byte = w4.packed[j * (k / 2) + kk / 2];
        const double w4v = static_cast<double>(e2m1_to_f32((kk & 1) ? (byte >> 4) : (byte & 0xF))) *
                           e8m0_to_f32(w4.scales[j * (k / 32) + kk / 32]);
        e8 += av * w8v;
        e4 += av * w4v;
        mag8 += std::fabs(av * w8v);
        mag4 += std::fabs(av * w4v);
      }
      const float r8 = y8[i * n + j], r4 = y4[i * n + j];
      EXPECT_LE(std::fabs(r8 - e8), bf16_ulp(static_cast<float>(e8)) + mag8 * 40 * 0x1p-24) << i << "," << j;
      EXPECT_LE(std::fabs(r4 - e4), bf16_ulp(static_cast<float>(e4)) + mag4 * 40 * 0x1p-24) << i << "," << j;
      equal += (r8 == round_bf16(static_cast<float>(e8))) + (r4 == round_bf16(static_cast<float>(e4)));
    }
  }
  EXPECT_GE(equal, 2 * m * n * 9 / 10);  // nearly always the correctly rounded value
}

TEST(LinearSimd, BlockGemmsBitIdenticalToReferenceOnEveryTarget) {
  struct Shape {
    size_t m, n, k;
  };
  // m = 1..3 take the row-by-row path, m >= 4 the 16-row tiles (with a partial last tile).
  const Shape shapes[] = {{1, 37, 96}, {1, 100, 256}, {3, 20, 64}, {5, 33, 160}, {17, 70, 128}, {1, 64, 1024}, {40, 50, 96}};
  std::mt19937 rng(3);
  for (const Shape& s : shapes) {
    auto x = random_bf16(s.m * s.k, rng, 4.0f);
    const Fp8Data w8 = random_fp8(s.n, s.k, rng);
    const Fp4Data w4 = random_fp4(s.n, s.k, rng);
    std::vector<float> scratch(fp8_act_scratch_floats(s.m, s.k));
    const Fp8Activations a = quantize_activations(x.data(), s.m, s.k, scratch);
    std::vector<float> want8(s.m * s.n), want4(s.m * s.n);
    ref::gemm_fp8(a, w8.view(s.n, s.k), want8.data());
    ref::gemm_fp4(a, w4.view(s.n, s.k), want4.data());
    ThreadPool pool(3);
    for_each_simd_target([&] {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> got8(s.m * s.n), got4(s.m * s.n);
        std::vector<float> scratch2(fp8_act_scratch_floats(s.m, s.k));
        linear_fp8(x.data(), s.m, w8.view(s.n, s.k), got8.data(), scratch2, p);
        linear_fp4(x.data(), s.m, w4.view(s.n, s.k), got4.data(), scratch2, p);
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
  std::mt19937 rng(4);
  const size_t m = 6, n = 64, k = 128;  // m >= kActTileMinRows: the row-tiled path
  std::vector<float> x(m * k);
  std::uniform_int_distribution<int> pick(0, 3);
  for (auto& v : x) {
    const int p = pick(rng);
    v = p == 0 ? 0x1p-20f : (p == 1 ? -3.0e4f : (p == 2 ? 0.0f : round_bf16(0.37f)));
  }
  Fp8Data w8 = random_fp8(n, k, rng);
  for (size_t i = 0; i < w8.codes.size(); i += 3) w8.codes[i] = static_cast<uint8_t>(i % 8);  // subnormals
  for (size_t i = 0; i < w8.scales.size(); ++i) w8.scales[i] = static_cast<uint8_t>(i % 2 ? 87 : 167);
  Fp4Data w4 = random_fp4(n, k, rng);
  for (size_t i = 0; i < w4.scales.size(); ++i) w4.scales[i] = static_cast<uint8_t>(i % 2 ? 87 : 167);
  std::vector<float> scratch(fp8_act_scratch_floats(m, k));
  const Fp8Activations a = quantize_activations(x.data(), m, k, scratch);
  std::vector<float> want8(m * n), want4(m * n);
  ref::gemm_fp8(a, w8.view(n, k), want8.data());
  ref::gemm_fp4(a, w4.view(n, k), want4.data());
  ASSERT_NE(a.values_t, nullptr);
  Fp8Activations untiled = a;  // the same operands through the row-by-row path
  untiled.values_t = nullptr;
  untiled.scales_t = nullptr;
  for_each_simd_target([&] {
    for (const Fp8Activations* act : {&a, static_cast<const Fp8Activations*>(&untiled)}) {
      std::vector<float> got8(m * n), got4(m * n);
      gemm_fp8(*act, w8.view(n, k), got8.data(), nullptr);
      gemm_fp4(*act, w4.view(n, k), got4.data(), nullptr);
      for (size_t i = 0; i < m * n; ++i) {
        ASSERT_EQ(bits_of(got8[i]), bits_of(want8[i])) << i;
        ASSERT_EQ(bits_of(got4[i]), bits_of(want4[i])) << i;
      }
    }
  });
}

TEST(LinearDense, RefWithinCanonicalSumBoundOfExact) {
  std::mt19937 rng(5);
  const size_t m = 3, n = 20, k = 1000;
  auto x = random_bf16(m * k, rng);
  auto wf = random_bf16(n * k, rng);
  std::vector<uint16_t> wb(n * k);
  f32_to_bf16(wf.data(), wb.data(), wb.size());
  std::vector<float> y32(m * n), y16(m * n);
  ref::linear_bf16(x.data(), m, Bf16Weight{wb.data(), n, k}, y32.data(), LinearOut::kF32);
  ref::linear_bf16(x.data(), m, Bf16Weight{wb.data(), n, k}, y16.data(), LinearOut::kBf16);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      double exact = 0, mag = 0;
      for (size_t kk = 0; kk < k; ++kk) {
        exact += static_cast<double>(x[i * k + kk]) * wf[j * k + kk];
        mag += std::fabs(static_cast<double>(x[i * k + kk]) * wf[j * k + kk]);
      }
      // 64-lane canonical order: each lane adds ceil(k/64) terms, then 6 fold levels; products of
      // bf16 values are exact. |err| <= (ceil(k/64) + 6) * 2^-24 * Σ|x w|.
      const double bound = (std::ceil(k / 64.0) + 6) * 0x1p-24 * mag;
      EXPECT_LE(std::fabs(y32[i * n + j] - exact), bound);
      EXPECT_EQ(y16[i * n + j], round_bf16(y32[i * n + j]));
    }
  }
}

TEST(LinearSimd, DenseBitIdenticalToReferenceOnEveryTarget) {
  std::mt19937 rng(6);
  for (size_t k : {7u, 64u, 100u, 1000u}) {
    const size_t m = 3, n = 70;
    auto x = random_bf16(m * k, rng);
    auto wf = random_bf16(n * k, rng);
    std::vector<float> wf32(n * k);
    std::normal_distribution<float> normal;
    for (auto& v : wf32) v = normal(rng);  // genuine f32 weights: products are not exact
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
  std::mt19937 rng(7);
  const size_t n = 40, k = 64;
  const Fp8Data w = random_fp8(n, k, rng);
  std::vector<uint16_t> out(n * k);
  dequantize_fp8_weight_to_bf16(w.view(n, k), out.data());
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < k; ++j) {
      const double v = static_cast<double>(e4m3_to_f32(w.codes[i * k + j])) *
                       e8m0_to_f32(w.scales[(i / 32) * (k / 32) + j / 32]);
      ASSERT_EQ(static_cast<double>(bf16_bits_to_f32(out[i * k + j])), v);
    }
  }
}

}  // namespace
}  // namespace cedar::ops
