// Helpers shared by the op tests and the op registry (harness/op_registry.h): float bit views, the
// bf16 unit in the last place, the unit roundoffs the derived bounds use, and the one random source
// (harness/op_rng.h: the same numbers on every machine) with the generators built on it (bf16-valued
// normals, uniform floats, block-scaled FP8/FP4 weights). Kept here once so that every test draws its
// inputs the same way; each test still picks its own seed.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "harness/op_rng.h"
#include "ops/attention/attention.h"
#include "ops/formats/formats.h"
#include "ops/linear/linear.h"
#include "ops/formats/quant.h"

namespace cedar::ops::testing {

inline constexpr double kU32 = 0x1p-24;   // fp32 unit roundoff
inline constexpr double kUBf16 = 0x1p-8;  // bf16 unit roundoff

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

inline float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// One bf16 ulp at |v| (8 significand bits); below the normal range, the spacing of bf16 subnormals.
inline float bf16_ulp(double v) {
  const double a = std::fabs(v);
  if (a < 0x1p-126) return 0x1p-133f;
  return static_cast<float>(std::exp2(std::floor(std::log2(a)) - 7));
}

// The op tests' random source (portable: its draws use no implementation-defined distribution). A
// test seeds one and passes it to the generators below, so its draw order is what the test reads.
using Rng = PortableRng;

// Portable stand-ins for the <random> distributions the tests used, with their call shape (dist(rng)).
struct Normal {
  float mean = 0.0f, sd = 1.0f;
  Normal() = default;
  Normal(float m, float s) : mean(m), sd(s) {}
  float operator()(Rng& rng) const { return rng.normal(mean, sd); }
};
template <typename T>
struct UniformInt {  // [lo, hi]
  T lo, hi;
  UniformInt(T l, T h) : lo(l), hi(h) {}
  T operator()(Rng& rng) const { return static_cast<T>(rng.uniform_int(lo, hi)); }
};
struct UniformReal {  // [lo, hi)
  float lo, hi;
  UniformReal(float l, float h) : lo(l), hi(h) {}
  float operator()(Rng& rng) const { return rng.uniform(lo, hi); }
};

// n normals with standard deviation sd, each rounded to bf16 (activations and weights as the model
// holds them).
inline std::vector<float> random_bf16(size_t n, Rng& rng, float sd = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(rng.normal(0.0f, sd));
  return v;
}

// The same from a fresh generator seeded with `seed`.
inline std::vector<float> random_bf16(size_t n, uint32_t seed, float sd = 1.0f) {
  Rng rng(seed);
  return random_bf16(n, rng, sd);
}

// n floats uniform in [lo, hi).
inline std::vector<float> random_uniform(size_t n, Rng& rng, float lo, float hi) {
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

// A linear's shape: m activation rows, n outputs, k inputs.
struct Shape {
  size_t m, n, k;
};

// Block-scaled weights as the checkpoint stores them: FP8 (E4M3 codes, one E8M0 scale per 32x32 block)
// or FP4 (packed E2M1 codes, one E8M0 scale per row and 32 columns).
struct BlockWeights {
  bool fp4 = false;
  size_t n = 0, k = 0;
  std::vector<uint8_t> data, scales;
  Fp8Weight fp8() const { return {data.data(), scales.data(), n, k}; }
  Fp4Weight fp4w() const { return {data.data(), scales.data(), n, k}; }
  // The exact value of element (row, col), scale included.
  double value(size_t row, size_t col) const {
    const size_t kblocks = k / 32;
    if (fp4) {
      float v[2];
      unpack_fp4_values(data.data() + row * (k / 2) + col / 2, 2, v);
      return static_cast<double>(v[col % 2]) * e8m0_to_f32(scales[row * kblocks + col / 32]);
    }
    return static_cast<double>(e4m3_to_f32(data[row * k + col])) * e8m0_to_f32(scales[(row / 32) * kblocks + col / 32]);
  }
};

// Uniformly random codes (no E4M3 NaN codes, which real weights never hold) and scales in
// [2^-10, 2^3]; k a multiple of 32.
inline BlockWeights random_block_weights(bool fp4, size_t n, size_t k, Rng& rng) {
  BlockWeights w;
  w.fp4 = fp4;
  w.n = n;
  w.k = k;
  w.data.resize(fp4 ? n * k / 2 : n * k);
  for (auto& b : w.data) {
    do b = static_cast<uint8_t>(rng.uniform_int(0, 255));
    while (!fp4 && (b & 0x7F) == 0x7F);  // no E4M3 NaN codes in real weights
  }
  w.scales.resize(fp4 ? n * (k / 32) : ((n + 31) / 32) * (k / 32));
  for (auto& s : w.scales) s = static_cast<uint8_t>(rng.uniform_int(117, 130));
  return w;
}

inline BlockWeights random_fp8_weights(size_t n, size_t k, Rng& rng) { return random_block_weights(false, n, k, rng); }
inline BlockWeights random_fp4_weights(size_t n, size_t k, Rng& rng) { return random_block_weights(true, n, k, rng); }

// FP4 rows as the indexer sees them: E2M1 values times a power-of-two scale per 32, scales drawn
// from [2^-lo, 2^hi] (a wide range makes some dots too wide for the fp32 path).
inline std::vector<float> random_fp4_rows(size_t rows, size_t d, Rng& rng, int scale_lo, int scale_hi) {
  static const float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  UniformInt<int> code(0, 15), sc(scale_lo, scale_hi);
  std::vector<float> v(rows * d);
  for (size_t b = 0; b < rows * d / 32; ++b) {
    const float s = std::ldexp(1.0f, sc(rng));
    for (size_t j = 0; j < 32; ++j) {
      const int c = code(rng);
      v[b * 32 + j] = (c & 8 ? -1.0f : 1.0f) * kE2m1[c & 7] * s;
    }
  }
  return v;
}

// Random packed FP4 rows (E2M1 codes, one E8M0 scale per 32 drawn from 127 + [lo, hi]); zero_row
// is all zero codes.
inline std::vector<uint8_t> random_packed_fp4(size_t rows, size_t d, Rng& rng, int lo, int hi,
                                              std::vector<uint8_t>* scales, size_t zero_row) {
  UniformInt<int> byte(0, 255), sc(lo, hi);
  std::vector<uint8_t> packed(rows * d / 2);
  scales->resize(rows * d / 32);
  for (auto& b : packed) b = static_cast<uint8_t>(byte(rng));
  for (auto& s : *scales) s = static_cast<uint8_t>(127 + sc(rng));
  std::fill(packed.begin() + zero_row * d / 2, packed.begin() + (zero_row + 1) * d / 2, 0);
  return packed;
}

// FP4 index keys in every form indexer_scores takes: dequantised rows, their exact-sum spreads and
// the integer key tiles (whose buffers start filled with stale values that must not leak).
struct IndexKeys {
  std::vector<float> rows;
  std::vector<uint8_t> spread, codes;
  std::vector<double> tile_scales;
  IndexKeyTiles tiles() const { return {codes.data(), tile_scales.data()}; }
};
inline IndexKeys make_index_keys(const std::vector<uint8_t>& packed, const std::vector<uint8_t>& scales, size_t n_keys,
                                 size_t d) {
  IndexKeys k{std::vector<float>(n_keys * d), std::vector<uint8_t>(n_keys),
              std::vector<uint8_t>(index_key_tile_code_bytes(n_keys, d), 0xEE),
              std::vector<double>(index_key_tile_scale_count(n_keys, d), -7.0)};
  for (size_t t = 0; t < n_keys; ++t) {
    fp4_dequant_e8m0(packed.data() + t * d / 2, scales.data() + t * d / 32, d, k.rows.data() + t * d);
    k.spread[t] = exact_sum_spread(k.rows.data() + t * d, d);
    append_index_key_tile(packed.data() + t * d / 2, scales.data() + t * d / 32, d, t, k.codes.data(),
                          k.tile_scales.data());
  }
  return k;
}

}  // namespace cedar::ops::testing
