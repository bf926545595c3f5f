// The dot products and sums of the numerics contract ("exact, then rounded once"; docs/NUMERICS.md §1,
// docs/GOLDEN.md §2.2), scalar definitions shared by every op and by the SIMD kernels' tests.
//
// Where the reference accumulates in fp32 (a bf16 or fp32 matmul, a reduction) the contract computes the
// exact sum and rounds it once to fp32. cedar evaluates it in float64:
//   * every product of two fp32 values (bf16 x bf16, bf16 x fp32, fp32 x fp32) is exact in float64
//     (at most 48 significant bits), so it is formed exactly and never rounded;
//   * the products are summed in float64 in one fixed order, the canonical 32-lane order: lane l
//     (0..31) accumulates the products of elements l, l+32, l+64, ... in that order from +0, then the
//     32 lane sums are folded by halving, s[i] += s[i + w] for w = 16, 8, 4, 2, 1;
//   * the double total is rounded once to fp32.
// A float64 sum of fp32-sized terms differs from the exact sum by far less than an fp32 ulp (relative
// error <= (ceil(k/32) + 5) * 2^-53 of sum |terms|), so the fp32 result equals the correctly rounded
// exact sum except when that lies within this error of an fp32 rounding boundary; the fixed order makes
// even those cases identical between the scalar code here and the Highway kernels (dot-inl.h), whose
// f64 vectors of 1, 2, 4 or 8 lanes all divide 32 and reproduce exactly this order.
#pragma once

#include <concepts>
#include <cstddef>

namespace cedar::ops {

inline constexpr size_t kDotLanes = 32;

// Folds the 32 lane sums in place and returns the total.
inline double fold_dot_lanes(double* s) {
  for (size_t w = kDotLanes / 2; w >= 1; w /= 2) {
    for (size_t i = 0; i < w; ++i) s[i] += s[i + w];
  }
  return s[0];
}

// Canonical float64 dot of a[k] and b(i) (a callable returning the fp32 value of element i); the
// products are exact.
template <typename BAt>
  requires std::invocable<BAt, size_t>
double dot_canonical_f64(const float* a, BAt b_at, size_t k) {
  double s[kDotLanes] = {};
  for (size_t i = 0; i < k; ++i) s[i % kDotLanes] += static_cast<double>(a[i]) * static_cast<double>(b_at(i));
  return fold_dot_lanes(s);
}

inline double dot_canonical_f64(const float* a, const float* b, size_t k) {
  return dot_canonical_f64(a, [b](size_t i) { return b[i]; }, k);
}

// The contract's fp32 dot product: the canonical float64 dot rounded once.
template <typename BAt>
  requires std::invocable<BAt, size_t>
float dot_canonical(const float* a, BAt b_at, size_t k) {
  return static_cast<float>(dot_canonical_f64(a, b_at, k));
}

inline float dot_canonical(const float* a, const float* b, size_t k) {
  return static_cast<float>(dot_canonical_f64(a, b, k));
}

// Canonical float64 sum of the fp32-ROUNDED products a[i]*b[i]: for reductions whose terms the
// reference materialises as an fp32 tensor first (x.square() of RMSNorm, the Engram gate's
// (h*w)*key), so only the reduction is exact. For bf16 x bf16 terms (exact in fp32) this equals
// dot_canonical_f64.
template <typename BAt>
  requires std::invocable<BAt, size_t>
double dot_rounded_products_f64(const float* a, BAt b_at, size_t k) {
  double s[kDotLanes] = {};
  for (size_t i = 0; i < k; ++i) s[i % kDotLanes] += static_cast<double>(a[i] * b_at(i));
  return fold_dot_lanes(s);
}

inline double dot_rounded_products_f64(const float* a, const float* b, size_t k) {
  return dot_rounded_products_f64(a, [b](size_t i) { return b[i]; }, k);
}

// The RMS statistic mean(x^2) of the contract from the float64 sum of the fp32 squares: divided by n
// in float64 (torch's mean divides the sum by n), rounded once to fp32.
inline float mean_square_f32(double sum_of_squares, size_t n) {
  return static_cast<float>(sum_of_squares / static_cast<double>(n));
}

}  // namespace cedar::ops
