// Rotary position embedding of DeepSeek-V4/V4.1 (spec §2.5; model.py precompute_freqs_cis and
// apply_rotary_emb).
//
// Frequencies (rope_dim = d, pairs i = 0..d/2-1), all f32 unless noted:
//   inv_freq_i = 1 / f32(base ^ (2i/d))          (the power is evaluated in double and rounded to f32,
//                                                  the division is f32)
//   YaRN (yarn.original_seq_len > 0), computed in double like the Python reference:
//     corr(r) = d * ln(orig / (2*pi*r)) / (2 * ln(base))
//     low  = max(floor(corr(beta_fast)), 0),  high = min(ceil(corr(beta_slow)), d - 1)
//     ramp_i = clamp(f32(i - low) / f32(max(high - low, 1e-3)), 0, 1),  smooth_i = 1 - ramp_i   (f32)
//     inv_freq_i <- (inv_freq_i / factor) * (1 - smooth_i) + inv_freq_i * smooth_i               (f32)
//   angle(pos, i) = f32(pos) * inv_freq_i        (f32 product; no mscale)
//   cos/sin of the f32 angle, evaluated in double and rounded once to f32 (numerics contract,
//   exact_math.h).
//
// Application (interleaved / GPT-J pairs on the LAST d dims of each head vector, x bf16-valued):
//   a = x[2i], b = x[2i+1], c = cos, s = sin (inverse: s = -s)
//   x[2i]   <- bf16(a*c - b*s)        each product rounded to f32 first (no FMA), as torch's complex
//   x[2i+1] <- bf16(a*s + b*c)        multiply does; then one bf16 rounding (the copy back to bf16)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace cedar::ops {

struct YarnParams {
  double factor = 16.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_seq_len = 65536;
};

enum class RopeDirection { kForward, kInverse };

class RopeTable {
 public:
  // rope_dim even (64 in V4.1). Positions [0, cached_positions) get a precomputed cos/sin table
  // (4 * rope_dim bytes per position, 256 B for d = 64); later positions are computed on the fly with
  // the identical formula, so results never depend on the cache size.
  RopeTable(int rope_dim, double base, std::optional<YarnParams> yarn, int64_t cached_positions);

  int rope_dim() const { return rope_dim_; }
  double base() const { return base_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }  // [rope_dim/2]
  // cos/sin for one position: cos_out, sin_out [rope_dim/2].
  void cos_sin(int64_t pos, float* cos_out, float* sin_out) const;

 private:
  int rope_dim_;
  double base_;
  std::vector<float> inv_freq_;
  int64_t cached_positions_;
  std::vector<float> cos_;  // [cached_positions, rope_dim/2]
  std::vector<float> sin_;  // [cached_positions, rope_dim/2]
};

// Rotates the last table.rope_dim() dims of every head vector in place.
// x: [n_tokens, n_heads, head_dim]; token t is at position pos0 + t * pos_stride (pos_stride = r for
// compressed entries of ratio r, whose group j sits at position j*r).
void apply_rope(const RopeTable& table, float* x, size_t n_tokens, size_t n_heads, size_t head_dim,
                int64_t pos0, int64_t pos_stride = 1, RopeDirection dir = RopeDirection::kForward);

}  // namespace cedar::ops
