// The op tests' one random source: SplitMix64, and draws built from its integers with exact or
// correctly rounded arithmetic only, so that a seed gives the same numbers on every machine, compiler
// and standard library (std::normal_distribution and friends are implementation-defined, so the
// draws below never use them).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace cedar::ops::testing {

class PortableRng {
 public:
  using result_type = uint64_t;  // a UniformRandomBitGenerator, for std::shuffle and the like
  explicit PortableRng(uint64_t seed = 0) : state_(seed) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<uint64_t>::max(); }

  // SplitMix64 (Steele, Lea, Flood 2014): a 64-bit counter through a fixed bijective mix.
  uint64_t operator()() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  // An integer in [lo, hi] (multiply-shift on the top 32 bits; the bias is below 2^-32 per value).
  int64_t uniform_int(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(((*this)() >> 32) * span >> 32);
  }

  // A multiple of 2^-24 in [0, 1), exactly.
  double unit() { return static_cast<double>((*this)() >> 40) * 0x1p-24; }

  // A float in [lo, hi): one correctly rounded fused multiply-add, then one rounding to float.
  float uniform(float lo, float hi) {
    return static_cast<float>(std::fma(static_cast<double>(hi) - lo, unit(), static_cast<double>(lo)));
  }

  // Approximately normal (Irwin-Hall: the sum of 12 unit draws minus 6 has mean 0 and variance 1;
  // tails end at 6 sd). The sum is exact in double; mean + sd * z rounds once to double, once to float.
  float normal(float mean = 0.0f, float sd = 1.0f) {
    uint64_t sum = 0;
    for (int i = 0; i < 12; ++i) sum += (*this)() >> 40;
    const double z = (static_cast<double>(sum) - 6.0 * 0x1p24) * 0x1p-24;
    return static_cast<float>(std::fma(static_cast<double>(sd), z, static_cast<double>(mean)));
  }

 private:
  uint64_t state_;
};

// A seed from a name (FNV-1a), so that a registry case draws the same inputs whatever else runs.
inline uint64_t seed_of(const char* name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (const char* p = name; *p != '\0'; ++p) h = (h ^ static_cast<uint8_t>(*p)) * 0x100000001B3ull;
  return h;
}

}  // namespace cedar::ops::testing
