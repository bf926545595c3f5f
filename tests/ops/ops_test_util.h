// Helpers shared by the op tests: float bit views, the bf16 unit in the last place, the unit roundoffs
// the derived bounds use, and the one random source with the generators built on it (bf16-valued
// normals, uniform floats, block-scaled FP8/FP4 weights). Kept here once so that every test draws its
// inputs the same way; each test still picks its own seed.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ops/formats.h"
#include "ops/linear.h"

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

// The op tests' random source. std::mt19937's output sequence for a seed is fixed by the C++ standard;
// a test seeds one and passes it to the generators below, so its draw order is what the test reads.
using Rng = std::mt19937;

// n normals with standard deviation sd, each rounded to bf16 (activations and weights as the model
// holds them).
inline std::vector<float> random_bf16(size_t n, Rng& rng, float sd = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(normal(rng));
  return v;
}

// The same from a fresh generator seeded with `seed`.
inline std::vector<float> random_bf16(size_t n, uint32_t seed, float sd = 1.0f) {
  Rng rng(seed);
  return random_bf16(n, rng, sd);
}

// n floats uniform in [lo, hi).
inline std::vector<float> random_uniform(size_t n, Rng& rng, float lo, float hi) {
  std::uniform_real_distribution<float> uniform(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = uniform(rng);
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
  std::uniform_int_distribution<int> byte(0, 255), sc(117, 130);
  w.data.resize(fp4 ? n * k / 2 : n * k);
  for (auto& b : w.data) {
    do b = static_cast<uint8_t>(byte(rng));
    while (!fp4 && (b & 0x7F) == 0x7F);  // no E4M3 NaN codes in real weights
  }
  w.scales.resize(fp4 ? n * (k / 32) : ((n + 31) / 32) * (k / 32));
  for (auto& s : w.scales) s = static_cast<uint8_t>(sc(rng));
  return w;
}

inline BlockWeights random_fp8_weights(size_t n, size_t k, Rng& rng) { return random_block_weights(false, n, k, rng); }
inline BlockWeights random_fp4_weights(size_t n, size_t k, Rng& rng) { return random_block_weights(true, n, k, rng); }

}  // namespace cedar::ops::testing
