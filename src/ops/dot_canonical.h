// The canonical f32 dot-product order shared by every fast path in ops and its scalar reference.
//
// A dot product of length k is summed in 64 "lanes": lane l accumulates the products of elements
// l, l+64, l+128, ... in that order, starting from +0; then the 64 lane sums are folded by halving,
// s[i] += s[i + w] for w = 32, 16, 8, 4, 2, 1. Any SIMD width that divides 64 (4, 8, 16 f32 lanes:
// SSE4, AVX2, AVX-512) produces exactly this order, so the fast paths are bit-identical to the scalar
// reference on every target, and cedar's results do not depend on the CPU it runs on.
// Products are rounded to f32 before the add (no FMA), except where they are exact anyway (bf16 x bf16,
// E4M3 x E4M3), where a fused multiply-add gives the same bits.
#pragma once

#include <cstddef>

namespace cedar::ops {

inline constexpr size_t kDotLanes = 64;

// Folds 64 lane sums in place and returns the total.
inline float fold_dot_lanes(float* s) {
  for (size_t w = kDotLanes / 2; w >= 1; w /= 2) {
    for (size_t i = 0; i < w; ++i) s[i] += s[i + w];
  }
  return s[0];
}

// Scalar canonical dot of a[k] and b(i) (a callable returning the f32 value of element i).
template <typename BAt>
float dot_canonical(const float* a, BAt b_at, size_t k) {
  float s[kDotLanes] = {};
  for (size_t i = 0; i < k; ++i) {
    const float p = a[i] * b_at(i);
    s[i % kDotLanes] += p;
  }
  return fold_dot_lanes(s);
}

inline float dot_canonical(const float* a, const float* b, size_t k) {
  return dot_canonical(
      a, [b](size_t i) { return b[i]; }, k);
}

}  // namespace cedar::ops
