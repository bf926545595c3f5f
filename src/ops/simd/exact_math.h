// Elementwise functions of the numerics contract ("exact, then rounded once"; docs/NUMERICS.md §1,
// docs/GOLDEN.md §2.2). The reference runs exp, sigmoid, silu, softplus, sqrt, rsqrt, cos and sin on
// fp32 tensors with CUDA's fast intrinsics, whose last bits a CPU cannot reproduce. The contract
// replaces each by one definite value: the function evaluated in float64 from the fp32 argument and
// rounded once to fp32. glibc's double functions are accurate to < 1 double ulp, so the result is the
// correctly rounded fp32 value except for the ~2^-29 of arguments whose exact value lies within a
// double ulp of an fp32 rounding boundary (any two accurate double libms then still agree almost
// always). Every op of cedar that needs one of these functions calls these helpers, scalar and SIMD
// paths alike, so no code path rounds differently.
#pragma once

#include <cmath>

namespace cedar::ops {

// exp(x); exp(-inf) = 0, exp(+inf) = +inf, NaN stays NaN.
inline float exp_f32(float x) { return static_cast<float>(std::exp(static_cast<double>(x))); }

// 1 / (1 + exp(-x)), the whole expression in double.
inline float sigmoid_f32(float x) {
  return static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x))));
}

// x / (1 + exp(-x)) (torch's silu), the whole expression in double.
inline float silu_f32(float x) {
  const double xd = static_cast<double>(x);
  return static_cast<float>(xd / (1.0 + std::exp(-xd)));
}

// torch softplus (beta 1, threshold 20): x itself above the threshold, else log1p(exp(x)) in double.
inline float softplus_f32(float x) {
  if (x > 20.0f) return x;
  return static_cast<float>(std::log1p(std::exp(static_cast<double>(x))));
}

// 1 / sqrt(v) of an fp32 statistic (mean + eps already added in fp32), in double, rounded once.
inline float rsqrt_f32(float v) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(v))); }

// cos / sin of an fp32 angle, in double, rounded once.
inline float cos_f32(float angle) { return static_cast<float>(std::cos(static_cast<double>(angle))); }
inline float sin_f32(float angle) { return static_cast<float>(std::sin(static_cast<double>(angle))); }

}  // namespace cedar::ops
