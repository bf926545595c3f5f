// Argmax and the exponential-race sampler (sample.h).
#include "ops/sample/sample.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "ops/simd/exact_math.h"

namespace cedar::ops {

int32_t argmax(const float* x, size_t n) {
  CEDAR_CHECK(n > 0, "argmax of an empty array");
  size_t best = 0;
  if (std::isnan(x[0])) return 0;
  for (size_t i = 1; i < n; ++i) {
    if (std::isnan(x[i])) return static_cast<int32_t>(i);
    if (x[i] > x[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

namespace {
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

SampleRng::SampleRng(uint64_t seed) {
  uint64_t sm = seed;
  for (auto& s : s_) s = splitmix64(sm);
}

uint64_t SampleRng::next_u64() {  // xoshiro256**
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double SampleRng::next_uniform_open0() {
  // (k + 1) / 2^53 for k in [0, 2^53): uniform on (0, 1].
  return static_cast<double>((next_u64() >> 11) + 1) * 0x1p-53;
}

float SampleRng::next_exponential() { return static_cast<float>(-std::log(next_uniform_open0())); }

int32_t sample_token(const float* logits, size_t n, float temperature, SampleRng& rng) {
  CEDAR_CHECK(n > 0, "sampling from an empty vocabulary");
  if (temperature == 0.0f) return argmax(logits, n);
  const float t = std::max(temperature, 1e-5f);
  float max_v = logits[0] / t;
  for (size_t i = 1; i < n; ++i) max_v = std::max(max_v, logits[i] / t);
  double sum_exact = 0.0;  // a sum feeding a division: float64, rounded once (numerics contract)
  for (size_t i = 0; i < n; ++i) sum_exact += exp_f32(logits[i] / t - max_v);
  const float sum = static_cast<float>(sum_exact);
  // argmax_i (p_i / E_i); the first index wins ties, like torch.argmax.
  size_t best = 0;
  float best_v = -1.0f;
  for (size_t i = 0; i < n; ++i) {
    const float p = exp_f32(logits[i] / t - max_v) / sum;
    const float race = p / rng.next_exponential();
    if (race > best_v) {
      best_v = race;
      best = i;
    }
  }
  return static_cast<int32_t>(best);
}

}  // namespace cedar::ops
