// Engram module arithmetic: table-row dequantisation against the E4M3/E8M0 definitions (hand cases),
// and the gated residual update against hand-worked cases, a step-by-step f32 restatement of the
// documented operation order, and a double-precision recomputation (property test).
#include "model/engram_module.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/formats/formats.h"

namespace cedar::model {
namespace {

constexpr uint16_t kBf16One = 0x3F80;

uint16_t bf16_bits(float v) { return ops::f32_to_bf16_bits(v); }

// ---- dequant_engram_rows ----------------------------------------------------------------------

TEST(EngramDequant, HandCasesAndBlockScales) {
  const int head_dim = 64;  // two scale blocks
  const int64_t rows = 3;
  std::vector<uint8_t> codes(rows * head_dim, 0x38);  // E4M3 0x38 = +1.0 (exponent 7 - bias 7)
  std::vector<uint8_t> scales(rows * 2, 127);         // E8M0 127 = 2^0
  // Row 2: column 0 = 0x7E (448) with scale 130 (2^3) -> 3584; column 1 = 0xB9 (-1.125) -> -9;
  // block 1 scale 126 (2^-1): columns 32..63 of 1.0 -> 0.5; column 63 = 0x7F (NaN).
  codes[2 * head_dim + 0] = 0x7E;
  codes[2 * head_dim + 1] = 0xB9;
  codes[2 * head_dim + 63] = 0x7F;
  scales[2 * 2 + 0] = 130;
  scales[2 * 2 + 1] = 126;
  // Row 0: tiny values with scale byte 0 (2^-127): 0x01 = 2^-9 -> 2^-136, below half the smallest
  // bf16 subnormal 2^-133 -> +0; 0x07 = 7 * 2^-9 -> 0.875 * 2^-133 -> rounds up to 2^-133.
  codes[0] = 0x01;
  codes[1] = 0x07;
  scales[0] = 0;
  const std::vector<int64_t> ids = {2, 0, 2};
  std::vector<float> out(ids.size() * head_dim, -1.0f);
  ASSERT_TRUE(dequant_engram_rows(codes, scales, rows, head_dim, ids, out, ThreadPool::global()).ok());
  for (int r : {0, 2}) {
    const float* row2 = out.data() + r * head_dim;
    EXPECT_EQ(row2[0], 3584.0f);
    EXPECT_EQ(row2[1], -9.0f);
    EXPECT_EQ(row2[2], 8.0f);   // 1.0 * 2^3, still block 0
    EXPECT_EQ(row2[31], 8.0f);  // last column of block 0
    EXPECT_EQ(row2[32], 0.5f);  // first column of block 1
    EXPECT_TRUE(std::isnan(row2[63]));
  }
  const float* row0 = out.data() + 1 * head_dim;
  EXPECT_EQ(row0[0], 0.0f);
  EXPECT_FALSE(std::signbit(row0[0]));
  EXPECT_EQ(row0[1], std::ldexp(1.0f, -133));
  EXPECT_EQ(row0[2], std::ldexp(1.0f, -127));  // 1.0 * 2^-127 is a bf16 subnormal exactly
  EXPECT_EQ(row0[32], 1.0f);
}

TEST(EngramDequant, EveryCodeTimesEveryScaleIsBf16OfTheExactProduct) {
  // One row per scale byte, all 256 codes across 256 columns (8 blocks with the same scale).
  const int head_dim = 256;
  const int64_t rows = 256;
  std::vector<uint8_t> codes(rows * head_dim), scales(rows * 8);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < head_dim; ++c) codes[r * head_dim + c] = static_cast<uint8_t>(c);
    for (int b = 0; b < 8; ++b) scales[r * 8 + b] = static_cast<uint8_t>(r);
  }
  std::vector<int64_t> ids(rows);
  for (int r = 0; r < rows; ++r) ids[r] = r;
  std::vector<float> out(rows * head_dim);
  ASSERT_TRUE(dequant_engram_rows(codes, scales, rows, head_dim, ids, out, ThreadPool::global()).ok());
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < head_dim; ++c) {
      // Definitions: E4M3FN value from its fields, E8M0 = 2^(b-127), product in double (exact),
      // then f32 and bf16 RNE.
      const int sign = c >> 7, exp = (c >> 3) & 15, man = c & 7;
      const float got = out[r * head_dim + c];
      if ((c & 0x7F) == 0x7F || r == 255) {
        EXPECT_TRUE(std::isnan(got)) << r << " " << c;
        continue;
      }
      const double mag = exp == 0 ? std::ldexp(man / 8.0, -6) : std::ldexp(1.0 + man / 8.0, exp - 7);
      const double exact = (sign ? -mag : mag) * std::ldexp(1.0, r - 127);
      // The largest products (448 * 2^127) overflow f32 and become infinities, as in the reference.
      const float inf = std::numeric_limits<float>::infinity();
      const float as_f32 = std::fabs(exact) > std::numeric_limits<float>::max() ? (sign ? -inf : inf)
                                                                                 : static_cast<float>(exact);
      ASSERT_EQ(got, ops::round_bf16(as_f32)) << "scale " << r << " code " << c;
    }
  }
}

TEST(EngramDequant, RowOutsideTableIsAnError) {
  std::vector<uint8_t> codes(2 * 32, 0x38), scales(2, 127);
  std::vector<float> out(32);
  for (int64_t bad : {int64_t{2}, int64_t{-1}}) {
    const std::vector<int64_t> ids = {bad};
    const Status st = dequant_engram_rows(codes, scales, 2, 32, ids, out, ThreadPool::global());
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("row id " + std::to_string(bad)), std::string::npos) << st.message();
  }
}

// ---- gate -------------------------------------------------------------------------------------

double sigmoid_d(double s) { return 1.0 / (1.0 + std::exp(-s)); }

TEST(EngramGate, GateFromDotHandCases) {
  EXPECT_NEAR(engram_gate_from_dot(4.0f), sigmoid_d(2.0), 1e-7);
  EXPECT_NEAR(engram_gate_from_dot(-4.0f), sigmoid_d(-2.0), 1e-7);
  EXPECT_NEAR(engram_gate_from_dot(0.25f), sigmoid_d(0.5), 1e-7);
  // |dot| below 1e-6 is clamped before the sqrt; the sign survives (copysign), zero counts as +.
  EXPECT_NEAR(engram_gate_from_dot(0.0f), sigmoid_d(1e-3), 1e-7);
  EXPECT_NEAR(engram_gate_from_dot(1e-9f), sigmoid_d(1e-3), 1e-7);
  EXPECT_NEAR(engram_gate_from_dot(-1e-9f), sigmoid_d(-1e-3), 1e-7);
  EXPECT_NEAR(engram_gate_from_dot(-0.0f), sigmoid_d(-1e-3), 1e-7);
  EXPECT_TRUE(std::isnan(engram_gate_from_dot(std::nanf(""))));
  EXPECT_EQ(engram_gate_from_dot(1e30f), 1.0f);
  EXPECT_EQ(engram_gate_from_dot(-1e30f), 0.0f);
}

TEST(EngramGate, HandWorkedTokens) {
  // hc = 2, dim = 4, three tokens. Values worked out by hand (and checked with Python floats):
  //   token 0 stream 0: h = 1, key = 1, w = 1: rstd = 1, dot = 4 * 4^-0.5 = 2, gate = sigmoid(√2)
  //   token 0 stream 1: h = ±2, key = ∓1, w = 2 * 0.5: rstd = 0.5, dot = -8 * 0.5 * 0.5 = -2
  //   token 1: h = 0 (both streams): dot = 0, gate = sigmoid(+1e-3)
  //   token 2: an image token: gate 0, x unchanged
  const EngramGateShape shape{3, 2, 4};
  std::vector<float> x = {1, 1, 1, 1, 2, -2, 2, -2,  //
                          0, 0, 0, 0, 0, 0, 0, 0,    //
                          3, 3, 3, 3, 3, 3, 3, 3};
  const std::vector<float> value = {1, 2, -1, 0.5};
  std::vector<float> kv;
  const std::vector<std::vector<float>> keys = {{1, 1, 1, 1}, {-1, 1, -1, 1}};
  for (int t = 0; t < 3; ++t) {
    for (const auto& k : keys) kv.insert(kv.end(), k.begin(), k.end());
    kv.insert(kv.end(), value.begin(), value.end());
  }
  const std::vector<uint16_t> q = {kBf16One, kBf16One, kBf16One, kBf16One,
                                   bf16_bits(2), bf16_bits(2), bf16_bits(2), bf16_bits(2)};
  const std::vector<uint16_t> k = {kBf16One, kBf16One, kBf16One, kBf16One,
                                   bf16_bits(0.5), bf16_bits(0.5), bf16_bits(0.5), bf16_bits(0.5)};
  const std::vector<uint8_t> text = {1, 1, 0};
  std::vector<float> gates(6);
  EngramGateScratch scratch;
  engram_gate_update(x, kv, q, k, shape, 1e-20f, text, gates, ThreadPool::global(), scratch);

  EXPECT_NEAR(gates[0], 0.8044296825069569, 1e-6);
  EXPECT_NEAR(gates[1], 0.1955703174930431, 1e-6);
  EXPECT_NEAR(gates[2], 0.5002499999791666, 1e-6);
  EXPECT_NEAR(gates[3], 0.5002499999791666, 1e-6);
  EXPECT_EQ(gates[4], 0.0f);
  EXPECT_EQ(gates[5], 0.0f);
  const std::vector<float> expect = {1.8046875f, 2.609375f, 0.1953125f, 1.3984375f,  //
                                     2.203125f, -1.609375f, 1.8046875f, -1.8984375f, //
                                     0.5f, 1.0f, -0.5f, 0.25f, 0.5f, 1.0f, -0.5f, 0.25f,  //
                                     3, 3, 3, 3, 3, 3, 3, 3};
  EXPECT_EQ(x, expect);
}

// Independent restatement of the documented numerics contract (engram_module.h, docs/NUMERICS.md §1):
// fp32 products, sums taken exactly (long double holds these sums of fp32 terms exactly) and rounded
// once, the mean divided before that rounding, rsqrt and sigmoid from long double rounded once.
long double exact_sum(const std::vector<float>& terms) {
  long double s = 0;
  for (float t : terms) s += t;
  return s;
}
struct RandomCase {
  EngramGateShape shape;
  std::vector<float> x, kv;
  std::vector<uint16_t> q, k;
  std::vector<uint8_t> text;
};

RandomCase random_case(uint32_t seed, int64_t n, int hc, int dim) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  RandomCase c;
  c.shape = {n, hc, dim};
  for (int64_t i = 0; i < n * hc * dim; ++i) c.x.push_back(ops::round_bf16(nd(rng) * 2.0f));
  for (int64_t i = 0; i < n * (hc + 1) * dim; ++i) c.kv.push_back(ops::round_bf16(nd(rng) * 0.5f));
  for (int i = 0; i < hc * dim; ++i) {
    c.q.push_back(bf16_bits(1.0f + 0.2f * nd(rng)));
    c.k.push_back(bf16_bits(1.0f + 0.2f * nd(rng)));
  }
  for (int64_t t = 0; t < n; ++t) c.text.push_back(t % 5 != 3);
  return c;
}

TEST(EngramGate, MatchesStepByStepContractRestatement) {
  const RandomCase c = random_case(11, 6, 4, 320);
  std::vector<float> x = c.x, gates(6 * 4);
  EngramGateScratch scratch;
  engram_gate_update(x, c.kv, c.q, c.k, c.shape, 1e-20f, c.text, gates, ThreadPool::global(), scratch);
  const int hc = 4, dim = 320;
  const float scale = static_cast<float>(1.0 / std::sqrt(320.0));
  for (int t = 0; t < 6; ++t) {
    for (int j = 0; j < hc; ++j) {
      const float* h = c.x.data() + (t * hc + j) * dim;
      const float* key = c.kv.data() + (t * (hc + 1) + j) * dim;
      const float* val = c.kv.data() + (t * (hc + 1) + hc) * dim;
      std::vector<float> hh(dim), kk(dim), prod(dim);
      for (int d = 0; d < dim; ++d) {
        hh[d] = h[d] * h[d];
        kk[d] = key[d] * key[d];
        const float w = ops::bf16_bits_to_f32(c.q[j * dim + d]) * ops::bf16_bits_to_f32(c.k[j * dim + d]);
        prod[d] = (h[d] * w) * key[d];
      }
      const float mean_h = static_cast<float>(exact_sum(hh) / dim);
      const float mean_k = static_cast<float>(exact_sum(kk) / dim);
      const float rh = static_cast<float>(1.0L / std::sqrt(static_cast<long double>(mean_h + 1e-20f)));
      const float rk = static_cast<float>(1.0L / std::sqrt(static_cast<long double>(mean_k + 1e-20f)));
      const float dot = (static_cast<float>(exact_sum(prod)) * (rh * rk)) * scale;
      float mag = std::fabs(dot);
      if (mag < 1e-6f) mag = 1e-6f;
      const float s = std::copysign(std::sqrt(mag), dot);
      const float gate = c.text[t] ? static_cast<float>(1.0L / (1.0L + std::exp(-static_cast<long double>(s)))) : 0.0f;
      ASSERT_EQ(gates[t * hc + j], gate) << "token " << t << " stream " << j;
      for (int d = 0; d < dim; ++d) {
        const float gv = gate * val[d];
        ASSERT_EQ(x[(t * hc + j) * dim + d], ops::round_bf16(h[d] + gv)) << t << " " << j << " " << d;
      }
    }
  }
}

// bf16 RNE of a double, from the definition (8 significant bits), for normal-range values.
double bf16_of_double(double v) {
  if (v == 0) return v;
  int e;
  const double m = std::frexp(v, &e);  // v = m * 2^e, 0.5 <= |m| < 1
  return std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8);
}

TEST(EngramGate, AgreesWithDoubleRecomputation) {
  const int64_t n = 8;
  const int hc = 4, dim = 512;
  const RandomCase c = random_case(2024, n, hc, dim);
  std::vector<float> x = c.x, gates(n * hc);
  EngramGateScratch scratch;
  engram_gate_update(x, c.kv, c.q, c.k, c.shape, 1e-20f, c.text, gates, ThreadPool::global(), scratch);
  int checked_x = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < hc; ++j) {
      const float* h = c.x.data() + (t * hc + j) * dim;
      const float* key = c.kv.data() + (t * (hc + 1) + j) * dim;
      const float* val = c.kv.data() + (t * (hc + 1) + hc) * dim;
      double sh = 0, sk = 0, dot = 0, abs_dot = 0;
      for (int d = 0; d < dim; ++d) {
        const double w = static_cast<double>(ops::bf16_bits_to_f32(c.q[j * dim + d])) *
                         ops::bf16_bits_to_f32(c.k[j * dim + d]);
        sh += static_cast<double>(h[d]) * h[d];
        sk += static_cast<double>(key[d]) * key[d];
        dot += h[d] * w * key[d];
        abs_dot += std::fabs(h[d] * w * key[d]);
      }
      const double norm = 1.0 / std::sqrt(sh / dim + 1e-20) / std::sqrt(sk / dim + 1e-20) / std::sqrt(double(dim));
      dot *= norm;
      // f32 rounding bound of the dot: a few ulps of the absolute sum, plus the statistics' ulps.
      const double err = 4e-6 * abs_dot * norm + 1e-6 * std::fabs(dot);
      const auto gate_d = [](double v) {
        const double s = std::copysign(std::sqrt(std::max(std::fabs(v), 1e-6)), v);
        return 1.0 / (1.0 + std::exp(-s));
      };
      const float g = gates[t * hc + j];
      if (!c.text[t]) {
        EXPECT_EQ(g, 0.0f);
      } else {
        EXPECT_GE(g, gate_d(dot - err) - 1e-6) << "token " << t << " stream " << j;
        EXPECT_LE(g, gate_d(dot + err) + 1e-6) << "token " << t << " stream " << j;
      }
      // Final update given the f32 gate: bf16(h + g*v) must be the RNE of the exact sum unless the
      // exact sum sits within f32 noise of a bf16 rounding midpoint.
      for (int d = 0; d < dim; ++d) {
        const double exact = h[d] + static_cast<double>(g) * val[d];
        const double want = bf16_of_double(exact);
        const float got = x[(t * hc + j) * dim + d];
        const double lo = bf16_of_double(exact * (1 - 1e-6)), hi = bf16_of_double(exact * (1 + 1e-6));
        if (lo == hi) {
          ASSERT_EQ(static_cast<double>(got), want) << t << " " << j << " " << d;
          ++checked_x;
        } else {
          ASSERT_TRUE(got == lo || got == hi) << t << " " << j << " " << d;
        }
      }
    }
  }
  EXPECT_GT(checked_x, static_cast<int>(n * hc * dim * 9 / 10));  // the ambiguous cases are rare
}

}  // namespace
}  // namespace cedar::model
