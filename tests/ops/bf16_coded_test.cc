// The 12-bit bf16 coding (ops/linear/bf16_coded.h):
//   * lossless: every weight decodes to its original bits, whatever the bits (NaN, infinities, zeros,
//     subnormals, rows with more than 16 high bytes);
//   * compact: a row whose high bytes take at most 16 values has no exception and reads 1.5 bytes per
//     weight; a block holding a high byte outside its row's table is an exception, and only that block;
//   * the fast GEMV on the coded form, on every compiled SIMD target, within the derived bound of the
//     exact bf16 linear (the products are the same exact fp32 values; only the fp32 sums differ),
//     rounding to bf16 once, and independent of the thread count; through fast::linear_bf16 when the
//     weight carries its coded form.
#include "ops/linear/bf16_coded.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "ops/formats/formats.h"
#include "ops/kernel_set.h"
#include "ops/linear/linear.h"
#include "ops/linear/linear_fast.h"
#include "ops_test_util.h"
#include "simd_targets.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h and simd_targets.h

// Weight-like rows: normal values times `scale`, as bf16 bits.
std::vector<uint16_t> normal_bf16(size_t count, Rng& rng, float scale) {
  Normal normal(0.0f, 1.0f);
  std::vector<uint16_t> bits(count);
  for (auto& b : bits) b = f32_to_bf16_bits(normal(rng) * scale);
  return bits;
}

size_t distinct_high_bytes(const uint16_t* row, size_t k) {
  std::set<int> seen;
  for (size_t i = 0; i < k; ++i) seen.insert(row[i] >> 8);
  return seen.size();
}

TEST(Bf16Coded, EveryBitPatternDecodesToItself) {
  Rng rng(3);
  const size_t n = 7, k = 448;  // three blocks and a plain tail of 64
  std::vector<uint16_t> bits = normal_bf16(n * k, rng, 0.02f);
  // Row 1: any 16 bits at all (NaNs, infinities, subnormals: far more than 16 high bytes).
  UniformInt<int> any(0, 0xFFFF);
  for (size_t i = 0; i < k; ++i) bits[k + i] = static_cast<uint16_t>(any(rng));
  // Row 2: zeros and signed zeros among normal values; row 3: one huge value in its last coded block.
  for (size_t i = 0; i < k; i += 5) bits[2 * k + i] = (i % 2) ? 0x8000 : 0x0000;
  bits[3 * k + k - 65] = f32_to_bf16_bits(3.0e38f);
  const Bf16Weight w{bits.data(), n, k};
  const auto coded = code_bf16(w);
  ASSERT_NE(coded, nullptr);
  for (size_t r = 0; r < n; ++r)
    for (size_t i = 0; i < k; ++i)
      ASSERT_EQ(bf16_coded_bits(*coded, r, i), bits[r * k + i]) << "row " << r << " weight " << i;
}

TEST(Bf16Coded, OnlyBlocksOutsideTheRowTableAreExceptions) {
  const size_t k = 512;  // four blocks of 128
  std::vector<uint16_t> bits(3 * k);
  // Row 0: 16 high bytes (0x3C..0x43 and their negatives), each with some low byte: no exception.
  for (size_t i = 0; i < k; ++i) {
    const uint16_t high = static_cast<uint16_t>((0x3C + i % 8) | ((i / 8) % 2 ? 0x80 : 0));
    bits[i] = static_cast<uint16_t>(high << 8 | (i * 37) % 256);
  }
  // Row 1: the same, and in block 2 one weight with a seventeenth high byte that appears once: only
  // block 2 is an exception.
  for (size_t i = 0; i < k; ++i) bits[k + i] = bits[i];
  bits[k + 2 * 128 + 77] = 0x4A12;
  // Row 2: seventeen high bytes, the rarest (four times, all in block 0) leaves the table.
  for (size_t i = 0; i < k; ++i) bits[2 * k + i] = bits[i];
  for (size_t i : {3, 50, 90, 127}) bits[2 * k + i] = static_cast<uint16_t>(0x5000 | i);
  ASSERT_EQ(distinct_high_bytes(bits.data(), k), 16u);
  ASSERT_EQ(distinct_high_bytes(bits.data() + k, k), 17u);
  const auto coded = code_bf16(Bf16Weight{bits.data(), 3, k});
  ASSERT_NE(coded, nullptr);
  EXPECT_EQ(coded->row_exceptions, (std::vector<uint32_t>{0, 0, 1, 2}));
  EXPECT_EQ(coded->exception_block, (std::vector<uint32_t>{2, 0}));
  EXPECT_EQ(coded->bytes(), 3 * k * 3 / 2 + 3 * 16 + 2 * 128 + 4 * (4 + 2));
  for (size_t r = 0; r < 3; ++r)
    for (size_t i = 0; i < k; ++i) ASSERT_EQ(bf16_coded_bits(*coded, r, i), bits[r * k + i]) << r << " " << i;
}

TEST(Bf16Coded, GaussianRowsReadOneAndAHalfBytesPerWeight) {
  // Weight-like rows spread over ~16 binades either side of zero, so the table covers nearly all.
  Rng rng(5);
  const size_t n = 64, k = 4096;
  const auto bits = normal_bf16(n * k, rng, 0.02f);
  const auto coded = code_bf16(Bf16Weight{bits.data(), n, k});
  ASSERT_NE(coded, nullptr);
  const double ratio = static_cast<double>(coded->bytes()) / (2.0 * n * k);
  EXPECT_LT(ratio, 0.77) << coded->exception_block.size() << " exception blocks of " << n * k / 128;
}

// The exact bf16 linear's value, and Σ|x·w| for the bound.
struct Exact {
  std::vector<float> y;
  std::vector<double> abs_sum;
};
Exact exact_linear(const std::vector<float>& x, const std::vector<uint16_t>& bits, size_t m, size_t n, size_t k) {
  Exact e{std::vector<float>(m * n), std::vector<double>(m * n, 0.0)};
  linear_bf16(x.data(), m, Bf16Weight{bits.data(), n, k}, e.y.data(), LinearOut::kF32, nullptr);
  for (size_t r = 0; r < m; ++r)
    for (size_t j = 0; j < n; ++j)
      for (size_t i = 0; i < k; ++i)
        e.abs_sum[r * n + j] += std::fabs(static_cast<double>(x[r * k + i]) * bf16_bits_to_f32(bits[j * k + i]));
  return e;
}

// The coded GEMV of n rows of k weights against the exact linear, m = 1..5 activation rows.
void check_gemv_within_the_bound(size_t k, Rng& rng) {
  SCOPED_TRACE("k " + std::to_string(k));
  Normal normal(0.0f, 1.0f);
  ThreadPool pool(3);
  const size_t n = 150;
  auto bits = normal_bf16(n * k, rng, 0.05f);
  // Exceptions in some rows: a dozen values, each in a binade pair of its own far below the row's,
  // in one block per row (the row's table keeps its 16 most frequent high bytes).
  for (size_t r = 0; r < n; r += 7)
    for (int j = 0; j < 12; ++j)
      bits[r * k + (r % (k / 128)) * 128 + 9 * j] = f32_to_bf16_bits(std::ldexp(j % 2 ? -1.0f : 1.0f, -30 - 2 * j));
  for (size_t i = 0; i < k; ++i) bits[5 * k + i] = f32_to_bf16_bits(std::ldexp(1.0f, static_cast<int>(i % 40) - 20));
  const auto coded = code_bf16(Bf16Weight{bits.data(), n, k});
  ASSERT_NE(coded, nullptr);
  ASSERT_GT(coded->exception_block.size(), 20u);
  const Bf16Weight w{bits.data(), n, k, coded.get()};
  for (size_t m = 1; m <= 5; ++m) {
    std::vector<float> x(m * k);
    for (auto& v : x) v = normal(rng);  // full fp32 mantissas
    const Exact want = exact_linear(x, bits, m, n, k);
    for_each_simd_target([&] {
      std::vector<float> got(m * n), got_pool(m * n), got_bf16(m * n), via_linear(m * n);
      fast::bf16_coded_gemv(x.data(), m, *coded, got.data(), false, 0, n);
      fast::bf16_coded_gemv(x.data(), m, *coded, got_bf16.data(), true, 0, n);
      fast::linear_bf16(x.data(), m, w, via_linear.data(), LinearOut::kF32, &pool);
      for (size_t b = 0; b < n; b += 40)
        fast::bf16_coded_gemv(x.data(), m, *coded, got_pool.data(), false, b, std::min(n, b + 40));
      for (size_t i = 0; i < m * n; ++i) {
        // fp32 sums of k exact products on the fast side, one rounding on the exact side.
        const double bound = 1.01 * (k + 1.0) * kU32 * want.abs_sum[i];
        ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want.y[i]), bound) << "m" << m << " @" << i;
        ASSERT_EQ(got_bf16[i], round_bf16(got[i])) << "bf16 output is the f32 result rounded once, m" << m;
        ASSERT_EQ(got_pool[i], got[i]) << "row ranges change no result, m" << m << " @" << i;
        ASSERT_EQ(via_linear[i], got[i]) << "fast::linear_bf16 takes the coded GEMV, m" << m << " @" << i;
      }
    });
  }
}

TEST(Bf16Coded, GemvWithinTheDerivedBoundOfExactOnEveryTarget) {
  Rng rng(9);
  check_gemv_within_the_bound(640, rng);  // five blocks
  check_gemv_within_the_bound(192, rng);  // one block and the plain tail
}

TEST(Bf16Coded, GemvSumsSmallIntegersExactly) {
  // Integer weights and activations with every partial sum below 2^24: any summation order gives the
  // exact value, so a misplaced weight, activation or exception shows as a difference of at least 1.
  Rng rng(13);
  UniformInt<int> small(-8, 8), act(-16, 16);
  const size_t n = 40, k = 320;  // two blocks and the plain tail
  std::vector<uint16_t> bits(n * k);
  for (auto& b : bits) b = f32_to_bf16_bits(static_cast<float>(small(rng)));
  // Exceptions: ±2^4..2^17 once each in block 1 of every third row, 14 more high bytes than the 7 of
  // -8..8 (a high byte holds two binades); every partial sum stays below 2^24.
  for (size_t r = 0; r < n; r += 3)
    for (int j = 4; j <= 17; ++j) {
      bits[r * k + 128 + 2 * j] = f32_to_bf16_bits(std::ldexp(1.0f, j));
      bits[r * k + 129 + 2 * j] = f32_to_bf16_bits(-std::ldexp(1.0f, j));
    }
  const auto coded = code_bf16(Bf16Weight{bits.data(), n, k});
  ASSERT_NE(coded, nullptr);
  ASSERT_EQ(coded->exception_block.size(), (n + 2) / 3);
  for (size_t m = 1; m <= 5; ++m) {
    std::vector<float> x(m * k);
    for (auto& v : x) v = static_cast<float>(act(rng));
    std::vector<float> want(m * n, 0.0f);
    for (size_t r = 0; r < m; ++r)
      for (size_t j = 0; j < n; ++j)
        for (size_t i = 0; i < k; ++i) want[r * n + j] += x[r * k + i] * bf16_bits_to_f32(bits[j * k + i]);
    for_each_simd_target([&] {
      std::vector<float> got(m * n);
      fast::bf16_coded_gemv(x.data(), m, *coded, got.data(), false, 0, n);
      for (size_t i = 0; i < m * n; ++i) ASSERT_EQ(got[i], want[i]) << "m" << m << " @" << i;
    });
  }
}

// The kernel sets ready a GEMV weight at load: the fast set codes it (losslessly) behind w.coded and
// hands the copy over; the exact set, a width the form cannot hold and a weight already coded are
// left as they are.
TEST(Bf16Coded, KernelSetsReadyAGemvWeight) {
  Rng rng(13);
  const size_t n = 40, k = 192;
  const auto bits = normal_bf16(n * k, rng, 0.05f);
  Bf16Weight w{bits.data(), n, k};
  EXPECT_EQ(kernel_set(Numerics::kExact).prepare_gemv_weight(&w), nullptr);
  EXPECT_EQ(w.coded, nullptr);
  const auto coded = kernel_set(Numerics::kFast).prepare_gemv_weight(&w);
  ASSERT_NE(coded, nullptr);
  EXPECT_EQ(w.coded, coded.get());
  for (size_t r = 0; r < n; ++r)
    for (size_t i = 0; i < k; ++i) ASSERT_EQ(bf16_coded_bits(*coded, r, i), bits[r * k + i]) << r << " " << i;
  EXPECT_EQ(kernel_set(Numerics::kFast).prepare_gemv_weight(&w), nullptr);  // already coded
  EXPECT_EQ(w.coded, coded.get());
  Bf16Weight narrow{bits.data(), n * 3, 64 - 32};  // no whole coded block
  EXPECT_EQ(kernel_set(Numerics::kFast).prepare_gemv_weight(&narrow), nullptr);
  EXPECT_EQ(narrow.coded, nullptr);
}

}  // namespace
}  // namespace cedar::ops
