// Token selection (spec §2.8; model.py sample()).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops {

// Index of the largest value; the first one on ties (like torch.argmax). NaN counts as the maximum
// (torch propagates NaN through max), so the first NaN wins if any is present. n > 0.
int32_t argmax(const float* x, size_t n);

// A small portable, seedable generator (SplitMix64 seeding a xoshiro256** state). cedar's random
// stream is NOT torch's: the same seed never reproduces torch's exponential_() draws, so sampled
// tokens match the reference in distribution, not in value (argmax / temperature 0 matches exactly).
class SampleRng {
 public:
  explicit SampleRng(uint64_t seed);
  uint64_t next_u64();
  // Uniform in (0, 1]: 53 random bits, never 0, so -log(u) is finite.
  double next_uniform_open0();
  // Exp(1) variate as f32 (= -log(u)).
  float next_exponential();

 private:
  uint64_t s_[4];
};

// The reference sampler: temperature == 0 -> argmax(logits); otherwise
//   p = softmax(logits / max(T, 1e-5)) in f32 (max-subtracted; exp and the sum under the numerics
//   contract: exp in double rounded once, the sum in float64 rounded once), then argmax_i(p_i / E_i)
// with E_i ~ Exp(1) drawn in index order from rng (the exponential race, equivalent to sampling from
// p). No allocation; one pass for the max, one for the sum, one for the race.
int32_t sample_token(const float* logits, size_t n, float temperature, SampleRng& rng);

}  // namespace cedar::ops
