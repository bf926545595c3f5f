// RoPE tables and application (rope.h).
#include "ops/attention/rope.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "ops/simd/exact_math.h"
#include "ops/formats/formats.h"

namespace cedar::ops {
namespace {

std::vector<float> make_inv_freq(int dim, double base, const std::optional<YarnParams>& yarn) {
  const int half = dim / 2;
  std::vector<float> freq(half);
  for (int i = 0; i < half; ++i) {
    // torch: arange(0, dim, 2, f32) / dim is exact (2i/dim, dim a power of two in practice);
    // base ** e is evaluated in f32 by torch; the double pow rounded to f32 is the correctly rounded
    // value, which is what an accurate powf returns.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(dim);
    const float p = static_cast<float>(std::pow(base, static_cast<double>(expo)));
    freq[i] = 1.0f / p;
  }
  if (yarn && yarn->original_seq_len > 0) {
    const double pi = 3.14159265358979323846;
    const auto corrected_dim = [&](double rotations) {
      return dim * std::log(static_cast<double>(yarn->original_seq_len) / (rotations * 2 * pi)) /
             (2 * std::log(base));
    };
    const double low = std::max(std::floor(corrected_dim(yarn->beta_fast)), 0.0);
    const double high = std::min(std::ceil(corrected_dim(yarn->beta_slow)), static_cast<double>(dim - 1));
    // torch: (arange(half, f32) - low) / max(high - low, 1e-3) with Python numbers -> f32 ops.
    const float denom = static_cast<float>(std::max(high - low, 1e-3));
    const float low_f = static_cast<float>(low);
    const float factor = static_cast<float>(yarn->factor);
    for (int i = 0; i < half; ++i) {
      float ramp = (static_cast<float>(i) - low_f) / denom;
      ramp = std::min(std::max(ramp, 0.0f), 1.0f);
      const float smooth = 1.0f - ramp;
      freq[i] = freq[i] / factor * (1.0f - smooth) + freq[i] * smooth;
    }
  }
  return freq;
}

}  // namespace

RopeTable::RopeTable(int rope_dim, double base, std::optional<YarnParams> yarn, int64_t cached_positions)
    : rope_dim_(rope_dim), base_(base), cached_positions_(std::max<int64_t>(cached_positions, 0)) {
  CEDAR_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rope_dim must be even and positive, got %d", rope_dim);
  inv_freq_ = make_inv_freq(rope_dim, base, yarn);
  const size_t half = static_cast<size_t>(rope_dim / 2);
  cos_.resize(static_cast<size_t>(cached_positions_) * half);
  sin_.resize(static_cast<size_t>(cached_positions_) * half);
  for (int64_t p = 0; p < cached_positions_; ++p) {
    for (size_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq_[i];
      cos_[p * half + i] = cos_f32(angle);
      sin_[p * half + i] = sin_f32(angle);
    }
  }
}

void RopeTable::cos_sin(int64_t pos, float* cos_out, float* sin_out) const {
  CEDAR_CHECK(pos >= 0, "negative RoPE position %lld", static_cast<long long>(pos));
  const size_t half = static_cast<size_t>(rope_dim_ / 2);
  if (pos < cached_positions_) {
    std::copy_n(cos_.data() + pos * half, half, cos_out);
    std::copy_n(sin_.data() + pos * half, half, sin_out);
    return;
  }
  for (size_t i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq_[i];
    cos_out[i] = cos_f32(angle);
    sin_out[i] = sin_f32(angle);
  }
}

void apply_rope(const RopeTable& table, float* x, size_t n_tokens, size_t n_heads, size_t head_dim,
                int64_t pos0, int64_t pos_stride, RopeDirection dir) {
  const size_t rd = static_cast<size_t>(table.rope_dim());
  CEDAR_CHECK(rd <= head_dim, "rope_dim %zu exceeds head_dim %zu", rd, head_dim);
  const size_t half = rd / 2;
  float cosv[256];  // [half]
  float sinv[256];  // [half]
  CEDAR_CHECK(half <= 256, "rope_dim %zu too large", rd);
  for (size_t t = 0; t < n_tokens; ++t) {
    table.cos_sin(pos0 + static_cast<int64_t>(t) * pos_stride, cosv, sinv);
    if (dir == RopeDirection::kInverse) {
      for (size_t i = 0; i < half; ++i) sinv[i] = -sinv[i];  // conjugate
    }
    for (size_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim + (head_dim - rd);  // [rd]
      for (size_t i = 0; i < half; ++i) {
        const float a = v[2 * i];
        const float b = v[2 * i + 1];
        const float c = cosv[i];
        const float s = sinv[i];
        // Each product rounded separately (contraction is off for this module), as torch's complex
        // multiply computes (ac - bd) + (ad + bc)i.
        const float ac = a * c;
        const float bd = b * s;
        const float as = a * s;
        const float bc = b * c;
        v[2 * i] = round_bf16(ac - bd);
        v[2 * i + 1] = round_bf16(as + bc);
      }
    }
  }
}

}  // namespace cedar::ops
