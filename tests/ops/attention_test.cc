// Sparse attention, indexer scores and top-k: hand-worked cases, an exact (double) softmax oracle,
// and SIMD/reference identity on every target.
#include "ops/attention/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <limits>
#include <vector>

#include "core/thread_pool.h"
#include "ops/formats/formats.h"
#include "ops/attention/index_key_store.h"
#include "ops/attention/x86_indexer_tiles.h"
#include "ops/formats/quant.h"
#include "ops_test_util.h"
#include "simd_targets.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h and simd_targets.h

TEST(SparseAttn, HandWorkedSingleHead) {
  // q = e0, rows k0 = e0 and k1 = 0, scale 1, sink 0: scores 1 and 0, running max 1,
  // den = e^0 + e^-1 + e^(0-1); numerator = 1 * k0 (+ bf16(e^-1) * 0) -> o[0] = 1 / (1 + 2/e).
  const float q[4] = {1, 0, 0, 0};
  const float rows[8] = {1, 0, 0, 0, 0, 0, 0, 0};
  const float sink[1] = {0.0f};
  const int32_t idx[3] = {0, -1, 1};
  float out[4];
  sparse_attn(q, 1, 4, KvRows{rows, 2, nullptr, 0}, sink, idx, 3, 1.0f, out, nullptr);
  EXPECT_EQ(out[0], round_bf16(static_cast<float>(1.0 / (1.0 + 2.0 * std::exp(-1.0)))));
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[3], 0.0f);
}

TEST(SparseAttn, AllMaskedRowGivesZerosAndSoDoesScoreBelowMaxInit) {
  const float q[4] = {1e20f, 0, 0, 0};
  const float rows[4] = {-1e20f, 1, 1, 1};  // q·k = -1e40 -> -inf in f32, below the -1e30 start
  const float sink[1] = {5.0f};
  const int32_t all_masked[2] = {-1, -1};
  float out[4] = {9, 9, 9, 9};
  sparse_attn(q, 1, 4, KvRows{rows, 1, nullptr, 0}, sink, all_masked, 2, 1.0f, out, nullptr);
  for (float v : out) EXPECT_EQ(v, 0.0f);
  const float q2[4] = {-1e19f, 0, 0, 0};
  const float rows2[4] = {1e19f, 1, 1, 1};  // score -1e38 < -1e30: p = exp(-1e38 + 1e30) = 0
  const int32_t one[1] = {0};
  sparse_attn(q2, 1, 4, KvRows{rows2, 1, nullptr, 0}, sink, one, 1, 1.0f, out, nullptr);
  for (float v : out) EXPECT_EQ(v, 0.0f);
  const int32_t none[1] = {0};
  sparse_attn(q2, 1, 4, KvRows{rows2, 1, nullptr, 0}, sink, none, 0, 1.0f, out, nullptr);  // empty
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

// Exact softmax attention in double. The kernel's deviations: probabilities rounded to bf16 (relative
// 2^-9) in the numerator only, the bf16 output rounding, and f32 rounding elsewhere (~1e-6):
//   |o - exact| <= 2^-9 * Σ p|v| / den + 1 bf16 ulp(o) + 1e-5 * max|v|.
TEST(SparseAttn, ReferenceWithinDerivedBoundOfExactSoftmax) {
  Rng rng(1);
  const size_t heads = 4, d = 512, n_first = 128, n_second = 300;
  const auto q = random_bf16(heads * d, rng, 0.2f);
  const auto win = random_bf16(n_first * d, rng);
  const auto cmp = random_bf16(n_second * d, rng);
  const float sink[4] = {0.5f, -2.0f, 3.0f, 0.0f};
  std::vector<int32_t> idx;
  for (int i = 0; i < 128; ++i) idx.push_back(i % 7 == 3 ? -1 : i);
  for (int i = 0; i < 250; ++i) idx.push_back(128 + (i * 37) % 300);
  const KvRows kv{win.data(), n_first, cmp.data(), n_second};
  const float scale = 1.0f / std::sqrt(512.0f);
  std::vector<float> out(heads * d);
  ref::sparse_attn(q.data(), heads, d, kv, sink, idx.data(), idx.size(), scale, out.data());
  for (size_t h = 0; h < heads; ++h) {
    std::vector<double> s(idx.size(), -INFINITY);
    double mx = sink[h];
    for (size_t j = 0; j < idx.size(); ++j) {
      if (idx[j] < 0) continue;
      double dot = 0;
      for (size_t e = 0; e < d; ++e) dot += static_cast<double>(q[h * d + e]) * kv.row(idx[j], d)[e];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double den = std::exp(sink[h] - mx);
    for (double v : s) den += std::exp(v - mx);
    for (size_t e = 0; e < d; ++e) {
      double num = 0, abs_num = 0, vmax = 0;
      for (size_t j = 0; j < idx.size(); ++j) {
        if (idx[j] < 0) continue;
        const double p = std::exp(s[j] - mx), v = kv.row(idx[j], d)[e];
        num += p * v;
        abs_num += p * std::fabs(v);
        vmax = std::max(vmax, std::fabs(v));
      }
      const double exact = num / den;
      const double bound = 0x1p-9 * abs_num / den + bf16_ulp(exact) + 1e-5 * vmax;
      ASSERT_LE(std::fabs(out[h * d + e] - exact), bound) << "head " << h << " dim " << e;
    }
  }
}

// The numerics contract restated step by step (attention.h): exact q·k rounded once (the bf16
// products are exact in long double and 512 of them sum exactly there), the f32 scale, exp in long
// double rounded once, the block's Σp and P·V formed in long double and rounded once, the rest fp32.
TEST(SparseAttn, FollowsTheContractStepByStep) {
  Rng rng(5);
  const size_t heads = 4, d = 512, n_rows = 300;
  const auto q = random_bf16(heads * d, rng, 0.3f);
  const auto rows = random_bf16(n_rows * d, rng);
  const float sink[4] = {0.5f, -2.0f, 3.0f, 0.0f};
  std::vector<int32_t> idx;
  for (int i = 0; i < 200; ++i) idx.push_back(i % 9 == 4 ? -1 : (i * 53) % 300);
  const KvRows kv{rows.data(), n_rows, nullptr, 0};
  const float scale = static_cast<float>(std::pow(512.0, -0.5));
  std::vector<float> got(heads * d);
  sparse_attn(q.data(), heads, d, kv, sink, idx.data(), idx.size(), scale, got.data(), nullptr);
  const auto exp_once = [](float v) { return static_cast<float>(std::exp(static_cast<long double>(v))); };
  for (size_t h = 0; h < heads; ++h) {
    std::vector<float> acc(d, 0.0f);
    float m = -1e30f, den = 0.0f;
    for (size_t start = 0; start < idx.size(); start += 64) {
      const size_t end = std::min(idx.size(), start + 64);
      std::vector<float> s(end - start, -INFINITY);
      float block_max = -INFINITY;
      for (size_t j = start; j < end; ++j) {
        if (idx[j] >= 0) {
          long double dot = 0;
          for (size_t e = 0; e < d; ++e) dot += static_cast<long double>(q[h * d + e]) * rows[idx[j] * d + e];
          s[j - start] = static_cast<float>(dot) * scale;
        }
        block_max = std::max(block_max, s[j - start]);
      }
      const float m_new = std::max(m, block_max);
      const float alpha = exp_once(m - m_new);
      long double psum = 0;
      std::vector<long double> pv(d, 0);
      for (size_t j = start; j < end; ++j) {
        const float p = exp_once(s[j - start] - m_new);
        psum += p;
        if (idx[j] < 0) continue;
        for (size_t e = 0; e < d; ++e) pv[e] += static_cast<long double>(round_bf16(p)) * rows[idx[j] * d + e];
      }
      den = den * alpha + static_cast<float>(psum);
      for (size_t e = 0; e < d; ++e) acc[e] = acc[e] * alpha + static_cast<float>(pv[e]);
      m = m_new;
    }
    den += exp_once(sink[h] - m);
    for (size_t e = 0; e < d; ++e) {
      ASSERT_EQ(bits_of(got[h * d + e]), bits_of(round_bf16(acc[e] / den))) << "head " << h << " dim " << e;
    }
  }
}

// One query of 8 heads against a 128-row window and 200 compressed rows, 300 indices (some masked).
struct AttnCase {
  static constexpr size_t n_first = 128, n_second = 200;
  size_t heads;
  size_t d;
  std::vector<float> q, win, cmp, sink;
  std::vector<int32_t> idx;
  AttnCase(size_t head_dim, Rng& rng, size_t n_heads = 8)
      : heads(n_heads), d(head_dim), q(random_bf16(heads * d, rng, 0.3f)), win(random_bf16(n_first * d, rng)),
        cmp(random_bf16(n_second * d, rng)), sink(heads) {
    for (size_t h = 0; h < heads; ++h) sink[h] = static_cast<float>(h) - 3.0f;
    UniformInt<int> pick(-1, static_cast<int>(n_first + n_second) - 1);
    for (int i = 0; i < 300; ++i) idx.push_back(pick(rng));
  }
  KvRows kv() const { return {win.data(), n_first, cmp.data(), n_second}; }
};

TEST(SparseAttn, SimdBitIdenticalToReferenceOnEveryTarget) {
  Rng rng(2);
  for (size_t d : {64u, 512u, 100u}) {
    const AttnCase c(d, rng);
    const KvRows kv = c.kv();
    std::vector<float> want(c.heads * d);
    ref::sparse_attn(c.q.data(), c.heads, d, kv, c.sink.data(), c.idx.data(), c.idx.size(), 0.044f, want.data());
    ThreadPool pool(3);
    for_each_simd_target([&] {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> got(c.heads * d);
        sparse_attn(c.q.data(), c.heads, d, kv, c.sink.data(), c.idx.data(), c.idx.size(), 0.044f, got.data(), p);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << "d " << d << " @" << i;
      }
    });
  }
}

// fast::sparse_attn against the exact op. Per output element, with p_j = exp(s_j - m) and
// D = Σ p_j + exp(sink - m) from the exact scores in long double:
//   * rounding p_j to bf16 can fall either side on the two paths: 2^-8 of that term;
//   * the fp32 dot (head_dim terms) moves s_j by at most head_dim · 2^-24 · scale · Σ|q·v|, here
//     below 2^-12, which moves p_j and D by twice that, relatively; Exp adds 1 ulp;
//   * the fp32 sums of P·V and of D (300 terms) add 300 · 2^-24 relatively;
//   * each side rounds its output to bf16: one bf16 step apart at most, beyond the above.
// So |fast - exact| <= (2^-8 + 2^-10) · Σ_j p_j |v_j[d]| / D + 2^-10 · |out| + one bf16 step, which
// the test checks with 2^-7 for the first two terms together.
// The fast op runs heads in groups sharing each pass over the rows (a full group of 8 and the
// shorter ones: 13 = 8 + 5, 3), so the cases vary the head count too. Head 0's query is scaled by
// 2^7: its scores spread over hundreds, so many of its p round to zero while the other heads of its
// group still use those rows.
TEST(SparseAttn, FastWithinTheDerivedBoundOfExactOnEveryTarget) {
  Rng rng(5);
  for (const auto& [d, heads] : {std::pair<size_t, size_t>{64, 8}, {512, 13}, {100, 3}, {512, 8}}) {
    AttnCase c(d, rng, heads);
    for (size_t i = 0; i < d; ++i) c.q[i] *= 128.0f;
    const KvRows kv = c.kv();
    const float scale = 0.044f;
    std::vector<float> want(c.heads * d);
    ref::sparse_attn(c.q.data(), c.heads, d, kv, c.sink.data(), c.idx.data(), c.idx.size(), scale, want.data());
    // The bound's terms, per head and element.
    std::vector<double> mass(c.heads * d);  // Σ_j p_j |v_j[d]| / D
    for (size_t h = 0; h < c.heads; ++h) {
      std::vector<long double> s(c.idx.size(), -INFINITY);
      long double m = c.sink[h];
      for (size_t j = 0; j < c.idx.size(); ++j) {
        if (c.idx[j] < 0) continue;
        const float* row = kv.row(static_cast<size_t>(c.idx[j]), d);
        long double dot = 0;
        for (size_t i = 0; i < d; ++i) dot += static_cast<long double>(c.q[h * d + i]) * row[i];
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      long double den = std::exp(static_cast<long double>(c.sink[h]) - m);
      for (size_t j = 0; j < c.idx.size(); ++j) den += c.idx[j] < 0 ? 0 : std::exp(s[j] - m);
      for (size_t e = 0; e < d; ++e) {
        long double t = 0;
        for (size_t j = 0; j < c.idx.size(); ++j)
          if (c.idx[j] >= 0) t += std::exp(s[j] - m) * std::fabs(kv.row(static_cast<size_t>(c.idx[j]), d)[e]);
        mass[h * d + e] = static_cast<double>(t / den);
      }
    }
    ThreadPool pool(3);
    for_each_simd_target([&] {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> got(c.heads * d);
        fast::sparse_attn(c.q.data(), c.heads, d, kv, c.sink.data(), c.idx.data(), c.idx.size(), scale, got.data(), p);
        double err2 = 0, ref2 = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const double bound = 0x1p-7 * (mass[i] + std::fabs(want[i])) + bf16_ulp(want[i]) + 1e-30;
          ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), bound) << "d " << d << " @" << i;
          err2 += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
          ref2 += static_cast<double>(want[i]) * want[i];
        }
        EXPECT_LT(err2 / ref2, 1e-4) << "NMSE, d " << d;
      }
    });
  }
  // All masked: zeros, as the exact op gives.
  const std::vector<float> q(64, 0.5f), row(64, 1.0f);
  const KvRows kv{row.data(), 1, nullptr, 0};
  const int32_t masked[3] = {-1, -1, -1};
  const float sink0 = 0.0f;
  std::vector<float> out(64, 7.0f);
  fast::sparse_attn(q.data(), 1, 64, kv, &sink0, masked, 3, 0.125f, out.data(), nullptr);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(IndexerScores, HandWorked) {
  // d0 = q0·k = 2.5, d1 = q1·k = -2 -> relu 0; w = [0.5, 3]: 1.25 + 0 = 1.25.
  const float q[8] = {1, 1, 0, 0, -1, 0, 0, 0};
  const float w[2] = {0.5f, 3.0f};
  const float key[4] = {2, 0.5f, 0, 0};
  float score;
  indexer_scores(q, w, 2, 4, key, 1, &score, nullptr);
  EXPECT_EQ(score, 1.25f);
  // bf16 rounding of the dot: 1 + 2^-9 (not bf16) -> 1; then x3 = 3.
  const float q2[2] = {1.0f, 0x1p-9f};
  const float k2[2] = {1.0f, 1.0f};
  const float w2[1] = {3.0f};
  indexer_scores(q2, w2, 1, 2, k2, 1, &score, nullptr);
  EXPECT_EQ(score, 3.0f);
  // bf16 rounding of relu*w: 1.0078125 * 1.0078125 = 1.01568 -> bf16 1.015625; head sum of three such
  // in f32 = 3.046875 -> bf16 3.046875.
  const float q3[3] = {1.0078125f, 1.0078125f, 1.0078125f};
  const float k3[1] = {1.0f};
  const float w3[3] = {1.0078125f, 1.0078125f, 1.0078125f};
  indexer_scores(q3, w3, 3, 1, k3, 1, &score, nullptr);
  EXPECT_EQ(score, 3.046875f);
}

// The contract restated: each q·key dot of bf16 values is exact in double (128 products of 16 bits
// each), rounded once to fp32 then to bf16; relu * w as a bf16 product; the head sum of bf16 values in
// double (exact here), rounded once to fp32 then to bf16.
TEST(IndexerScores, ReferenceFollowsTheContract) {
  Rng rng(3);
  const size_t heads = 32, d = 128, n_keys = 200;
  const auto q = random_bf16(heads * d, rng);
  const auto keys = random_bf16(n_keys * d, rng);
  auto w = random_bf16(heads, rng, 0.05f);
  std::vector<float> got(n_keys);
  ref::indexer_scores(q.data(), w.data(), heads, d, keys.data(), n_keys, got.data());
  for (size_t t = 0; t < n_keys; ++t) {
    long double sum = 0;
    for (size_t h = 0; h < heads; ++h) {
      long double dot = 0;
      for (size_t e = 0; e < d; ++e) dot += static_cast<long double>(q[h * d + e]) * keys[t * d + e];
      const float db = round_bf16(static_cast<float>(dot));
      sum += round_bf16(std::max(db, 0.0f) * w[h]);
    }
    ASSERT_EQ(bits_of(got[t]), bits_of(round_bf16(static_cast<float>(sum)))) << t;
  }
}

TEST(IndexerScores, SimdBitIdenticalToReferenceOnEveryTarget) {
  Rng rng(4);
  const size_t heads = 32, d = 128, n_keys = 700;
  const auto q = random_bf16(heads * d, rng);
  const auto keys = random_bf16(n_keys * d, rng);
  const auto w = random_bf16(heads, rng, 0.05f);
  std::vector<float> want(n_keys);
  ref::indexer_scores(q.data(), w.data(), heads, d, keys.data(), n_keys, want.data());
  ThreadPool pool(2);
  for_each_simd_target([&] {
    std::vector<float> got(n_keys);
    indexer_scores(q.data(), w.data(), heads, d, keys.data(), n_keys, got.data(), &pool);
    for (size_t i = 0; i < n_keys; ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << i;
  });
}

TEST(IndexerScores, ExactSumSpreadBoundsTheRows) {
  const float a[4] = {0.0f, 1.5f, -6.0f, 0.5f};  // lowest bit 2^-1 (0.5, 1.5), top 2^2 (6)
  EXPECT_EQ(exact_sum_spread(a, 4), 3);
  const float zeros[3] = {0.0f, -0.0f, 0.0f};
  EXPECT_EQ(exact_sum_spread(zeros, 3), 0);
  const float one[1] = {0x1p-140f};  // a subnormal: far from 1
  EXPECT_EQ(exact_sum_spread(one, 1), kNoExactSpread);
  const float bad[2] = {1.0f, NAN};
  EXPECT_EQ(exact_sum_spread(bad, 2), kNoExactSpread);
  const float wide[2] = {0x1p20f, 0x1.8p-10f};  // top 20, lowest bit -11
  EXPECT_EQ(exact_sum_spread(wide, 2), 31);
}

TEST(IndexerScores, PackedFp4SpreadEqualsTheDequantisedRowsSpread) {
  // Random packed rows: zero blocks, single-magnitude blocks, scales across the whole E8M0 range
  // (including 0 and 255 = NaN); the packed computation must equal the float one on the dequantised row.
  Rng rng(12);
  UniformInt<int> byte(0, 255), kind(0, 5), mag(0, 7), near(117, 137);
  const size_t n = 128;
  for (int trial = 0; trial < 3000; ++trial) {
    uint8_t packed[64], scales[4];
    for (size_t b = 0; b < 4; ++b) {
      const int k = kind(rng);
      const int only = mag(rng);
      for (size_t i = 0; i < 16; ++i) {
        packed[b * 16 + i] = k == 0 ? 0 : k == 1 ? static_cast<uint8_t>(only | (only << 4) | (byte(rng) & 0x88))
                                                 : static_cast<uint8_t>(byte(rng));
      }
      scales[b] = static_cast<uint8_t>(k == 2 || trial % 97 == 0 ? byte(rng) : near(rng));
      if (trial % 101 == 0 && b == 1) scales[b] = 0xFF;  // NaN scale, also on all-zero codes
    }
    std::vector<float> row(n);
    fp4_dequant_e8m0(packed, scales, n, row.data());
    ASSERT_EQ(exact_sum_spread_fp4(packed, scales, n), exact_sum_spread(row.data(), n)) << "trial " << trial;
  }
}

TEST(IndexerScores, FastPathsForExactDotsAreBitIdenticalOnEveryTarget) {
  // With key spreads the dots that provably sum exactly run on fp32 vectors, and with the integer key
  // tiles as block sums of codes; the scores must equal the float64 contract bit for bit, for narrow
  // scale ranges (mostly the fast paths), wide ones (mostly float64), and rows of zeros. Queries that
  // are not FP4 (codes beyond 12 in a block, or values that are no E2M1 multiple) take the rows.
  Rng rng(8);
  ThreadPool pool(2);
  for (const auto& [lo, hi] : {std::pair{-3, 0}, std::pair{-12, 8}, std::pair{-40, 40}}) {
    for (size_t d : {size_t{32}, size_t{128}}) {
      const size_t heads = 16, n_keys = 300;
      std::vector<uint8_t> key_scales;
      const auto packed = random_packed_fp4(n_keys, d, rng, lo, hi, &key_scales, 5);
      // Scales at the top of E8M0's range: 2^126 and 2^127 overflow fp32 for the larger codes (the
      // rows hold inf), and 255 is NaN; such keys must score as the rows do.
      for (size_t t : {size_t{17}, size_t{18}, size_t{19}}) key_scales[t * d / 32] = static_cast<uint8_t>(253 + t - 17);
      const IndexKeys index_keys = make_index_keys(packed, key_scales, n_keys, d);
      const std::vector<float>& keys = index_keys.rows;
      const std::vector<uint8_t>& spread = index_keys.spread;
      const IndexKeyTiles tiles = index_keys.tiles();
      for (int q_kind = 0; q_kind < 3; ++q_kind) {
        auto q = random_fp4_rows(heads, d, rng, lo, hi);
        std::fill(q.begin(), q.begin() + d, 0.0f);
        if (q_kind == 1) q[d + 3] = 7.0f * std::fabs(q[d + 4]) + 1.0f;  // not E2M1 times the block's scale
        if (q_kind == 2) q[2 * d] = 0.3f;                                  // a bf16 value, no FP4 code
        for (auto& x : q) x = round_bf16(x);
        const auto w = random_bf16(heads, rng, 0.05f);
        std::vector<float> want(n_keys);
        ref::indexer_scores(q.data(), w.data(), heads, d, keys.data(), n_keys, want.data());
        for_each_tile_kernel([&] {
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
            std::vector<float> got(n_keys), got_tiles(n_keys);
            indexer_scores(q.data(), w.data(), heads, d, keys.data(), n_keys, got.data(), p, spread.data());
            // n_keys - 7: a partial last tile (its other lanes hold stale values that must not leak).
            indexer_scores(q.data(), w.data(), heads, d, keys.data(), n_keys - 7, got_tiles.data(), p, spread.data(),
                           &tiles);
            for (size_t i = 0; i < n_keys; ++i) {
              ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << "scales 2^" << lo << "..2^" << hi << " d" << d << " @" << i;
              if (i < n_keys - 7) {
                ASSERT_EQ(bits_of(got_tiles[i]), bits_of(want[i])) << "tiles, q kind " << q_kind << " d" << d << " @" << i;
              }
            }
          }
        });
      }
    }
  }
}

// The kernel-owned store (index_key_store.h): keys appended in pieces, truncated and appended again
// hold the same rows as the entries decoded in one go, and score bit for bit as the reference does on
// them, on every target and tile kernel, inline and on a pool.
TEST(IndexerScores, KeyStoreScoresAsTheReferenceOnItsEntries) {
  Rng rng(31);
  ThreadPool pool(2);
  const size_t d = kIndexKeyDim, heads = 32, n_keys = 301;
  std::vector<uint8_t> scales;
  const auto packed = random_packed_fp4(n_keys, d, rng, -3, 0, &scales, 7);
  std::vector<uint8_t> entries(n_keys * kIndexKeyEntryBytes), other(kIndexKeyEntryBytes, 0x11);
  for (size_t t = 0; t < n_keys; ++t) {
    std::memcpy(entries.data() + t * kIndexKeyEntryBytes, packed.data() + t * d / 2, d / 2);
    std::memcpy(entries.data() + t * kIndexKeyEntryBytes + d / 2, scales.data() + t * d / 32, d / 32);
  }
  IndexKeyStore store(d);
  ASSERT_EQ(store.entry_bytes(), kIndexKeyEntryBytes);
  store.append(entries.data(), 100);
  for (int i = 0; i < 5; ++i) store.append(other.data(), 1);  // a tail that is then rewritten
  store.truncate(100);
  store.append(entries.data() + 100 * kIndexKeyEntryBytes, n_keys - 100);
  ASSERT_EQ(store.size(), n_keys);
  const IndexKeys want_keys = make_index_keys(packed, scales, n_keys, d);
  for (size_t i = 0; i < n_keys * d; ++i) ASSERT_EQ(bits_of(store.rows()[i]), bits_of(want_keys.rows[i])) << i;
  const auto q = random_fp4_rows(heads, d, rng, -3, 0);
  const auto w = random_bf16(heads, rng, 0.05f);
  std::vector<float> want(n_keys);
  ref::indexer_scores(q.data(), w.data(), heads, d, want_keys.rows.data(), n_keys, want.data());
  for_each_tile_kernel([&] {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> got(n_keys, -1.0f);
      store.scores(q.data(), w.data(), heads, n_keys - 3, got.data(), p);
      for (size_t i = 0; i < n_keys - 3; ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << i;
      EXPECT_EQ(got[n_keys - 3], -1.0f);  // keys past n_keys are not scored
    }
  });
}

TEST(IndexerScores, TileMaskScoresOnlyFlaggedTilesAndLeavesTheRest) {
  // A pool consumer scores only the tiles that hold pool keys: flagged tiles get the contract's
  // bits, with or without the integer tiles and the pool; every other score keeps what it held.
  Rng rng(21);
  ThreadPool pool(2);
  const size_t heads = 8, d = 64, n_keys = 1000;  // 63 tiles, the last one partial
  std::vector<uint8_t> key_scales;
  const auto packed = random_packed_fp4(n_keys, d, rng, -6, 2, &key_scales, 5);
  const IndexKeys index_keys = make_index_keys(packed, key_scales, n_keys, d);
  const std::vector<float>& keys = index_keys.rows;
  const std::vector<uint8_t>& spread = index_keys.spread;
  const IndexKeyTiles tiles = index_keys.tiles();
  auto q = random_fp4_rows(heads, d, rng, -6, 2);
  for (auto& x : q) x = round_bf16(x);
  const auto w = random_bf16(heads, rng, 0.05f);
  std::vector<float> want(n_keys);
  ref::indexer_scores(q.data(), w.data(), heads, d, keys.data(), n_keys, want.data());
  const size_t n_tiles = (n_keys + kIndexKeyTile - 1) / kIndexKeyTile;
  std::vector<uint8_t> mask(n_tiles, 0);
  for (size_t j : {size_t{0}, size_t{1}, size_t{5}, size_t{17}, size_t{18}, size_t{19}, n_tiles - 1}) mask[j] = 1;
  constexpr float kUntouched = -12345.0f;
  for_each_tile_kernel([&] {
    for (const IndexKeyTiles* kt : {static_cast<const IndexKeyTiles*>(nullptr), &tiles})
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::vector<float> got(n_keys, kUntouched);
        indexer_scores(q.data(), w.data(), heads, d, keys.data(), n_keys, got.data(), p, spread.data(), kt, mask.data());
        for (size_t i = 0; i < n_keys; ++i) {
          if (mask[i / kIndexKeyTile]) {
            ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << "key " << i << (kt ? " tiles" : " rows");
          } else {
            ASSERT_EQ(got[i], kUntouched) << "key " << i << " of an unflagged tile was written";
          }
        }
      }
  });
}

TEST(IndexerScores, TilesAtTheirLimitsEqualTheReference) {
  // The tile kernels at the most heads and the widest head they take, every code at its largest
  // magnitude (keys ±6, so stored codes 0 and 24; query codes ±12): the block sums reach their
  // bounds (32 · 12 · 12 per key and block) and must still be exact.
  Rng rng(31);
  ThreadPool pool(2);
  const size_t heads = 128, d = 256, n_keys = 40;
  std::vector<uint8_t> key_scales;
  auto packed = random_packed_fp4(n_keys, d, rng, -2, 1, &key_scales, 3);
  for (auto& byte : packed) byte = (byte & 0x88) | 0x77;  // E2M1 code 7 (6.0), random signs
  const IndexKeys index_keys = make_index_keys(packed, key_scales, n_keys, d);
  const IndexKeyTiles tiles = index_keys.tiles();
  // E2M1 ±6 at 2^-2, and one ±0.5 per block: the block's codes are then ±12 (and one ±1).
  std::vector<float> q(heads * d);
  for (size_t j = 0; j < q.size(); ++j) q[j] = (rng() & 1 ? -1.0f : 1.0f) * (j % 32 == 31 ? 0.125f : 1.5f);
  const auto w = random_bf16(heads, rng, 0.05f);
  std::vector<float> want(n_keys);
  ref::indexer_scores(q.data(), w.data(), heads, d, index_keys.rows.data(), n_keys, want.data());
  for_each_tile_kernel([&] {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<float> got(n_keys);
      indexer_scores(q.data(), w.data(), heads, d, index_keys.rows.data(), n_keys, got.data(), p,
                     index_keys.spread.data(), &tiles);
      for (size_t i = 0; i < n_keys; ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << "key " << i;
    }
  });
}

// The top-k's key and taking passes are Highway kernels (ops/attention/topk.cc): each test runs on every
// compiled target.
TEST(TopK, LargestThenAscendingWithLowerIndexWinningTies) {
  for_each_simd_target([] {
    const float s[7] = {1, 3, 3, 2, 3, -INFINITY, 0};
    int32_t out[7], scratch[7];
    topk_ascending(s, 7, 2, out, scratch);
    EXPECT_EQ(out[0], 1);
    EXPECT_EQ(out[1], 2);
    topk_ascending(s, 7, 4, out, scratch);
    EXPECT_EQ(std::vector<int32_t>(out, out + 4), (std::vector<int32_t>{1, 2, 3, 4}));
    topk_ascending(s, 7, 7, out, scratch);  // k = n: everything, -inf included
    EXPECT_EQ(std::vector<int32_t>(out, out + 7), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
    const float z[5] = {0, 0, 0, 0, 0};  // all-zero relu rows: the first k positions
    topk_ascending(z, 5, 3, out, scratch);
    EXPECT_EQ(std::vector<int32_t>(out, out + 3), (std::vector<int32_t>{0, 1, 2}));
    const float withnan[4] = {1, NAN, 5, 2};
    topk_ascending(withnan, 4, 2, out, scratch);
    EXPECT_EQ(std::vector<int32_t>(out, out + 2), (std::vector<int32_t>{1, 2}));
  });
}

TEST(TopK, MatchesFullSortOnRandomInput) {
  for_each_simd_target([] {
    Rng rng(5);
    UniformInt<int> small(0, 20);  // many ties
    for (int trial = 0; trial < 50; ++trial) {
      const size_t n = 1 + static_cast<size_t>(trial) * 37;
      std::vector<float> s(n);
      for (auto& v : s) v = static_cast<float>(small(rng));
      const size_t k = std::min<size_t>(n, 1 + trial * 11);
      std::vector<int32_t> got(k), scratch(n), order(n);
      topk_ascending(s.data(), n, k, got.data(), scratch.data());
      for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return s[a] > s[b]; });
      std::vector<int32_t> want(order.begin(), order.begin() + k);
      std::sort(want.begin(), want.end());
      ASSERT_EQ(got, want) << "n " << n << " k " << k;
    }
  });
}

TEST(TopK, Bf16RadixSelectEqualsStableSortIncludingSpecialValues) {
  // Index scores are bf16: the radix path. Random bf16 values with many ties, ±0, ±inf and NaNs of
  // both signs; plus one non-bf16 value, which must take the general path with the same answer.
  for_each_simd_target([] {
    Rng rng(9);
    UniformInt<int> pick(0, 12), small(-6, 6);
    Normal normal(0.0f, 3.0f);
    for (int trial = 0; trial < 60; ++trial) {
      const size_t n = 1 + static_cast<size_t>(trial) * 53;
      std::vector<float> s(n);
      for (auto& v : s) {
        const int p = pick(rng);
        v = p == 0 ? INFINITY : p == 1 ? -INFINITY : p == 2 ? -0.0f : p == 3 ? 0.0f
          : p == 4 && trial % 3 == 0 ? (rng() & 1 ? NAN : -NAN) : p < 8 ? static_cast<float>(small(rng))
          : round_bf16(normal(rng));
      }
      if (trial % 4 == 1) s[n / 2] = 0.1f;  // not a bf16 value
      const size_t k = std::min<size_t>(n, 1 + (static_cast<size_t>(trial) * 29) % (n + 5));
      std::vector<int32_t> got(k), scratch(n), order(n);
      topk_ascending(s.data(), n, k, got.data(), scratch.data());
      for (size_t i = 0; i < n; ++i) order[i] = static_cast<int32_t>(i);
      // The contract's order: NaN first, then larger first (-0 == +0), then lower index (stable).
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        const bool na = std::isnan(s[a]), nb = std::isnan(s[b]);
        if (na != nb) return na;
        return !na && s[a] > s[b];
      });
      std::vector<int32_t> want(order.begin(), order.begin() + k);
      std::sort(want.begin(), want.end());
      ASSERT_EQ(got, want) << "trial " << trial << " n " << n << " k " << k;
    }
  });
}

}  // namespace
}  // namespace cedar::ops
