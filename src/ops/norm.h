// RMSNorm as the V4.1 reference computes it (spec §2.4; model.py RMSNorm.forward):
//   var  = (Σ_k fp32(x_k)^2) / dim                 (f32 sum of squares, f32 division)
//   xn_k = fp32(x_k) * rsqrt(var + eps)            (f32; rsqrt = 1 / sqrtf, correctly rounded sqrt)
//   y_k  = bf16( fp32(w_k) * xn_k )                (the weight multiplies AFTER normalisation)
// eps is 1e-20 for every V4.1 norm. Output values are bf16-representable floats.
// The sum of squares uses the canonical 64-lane order of dot_canonical.h: the SIMD path and the scalar
// reference (ref::rms_norm) are bit-identical; torch's own order differs by a few f32 ulps of var,
// which moves y by at most 1 bf16 ulp and only at rounding boundaries (NUMERICS.md).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops {

inline constexpr float kRmsNormEpsV41 = 1e-20f;

// x, y: [rows, dim] (y may alias x). weight: [dim] as bf16 bits (checkpoint layout).
void rms_norm(const float* x, size_t rows, size_t dim, const uint16_t* weight_bf16, float eps, float* y);
// Same with an f32 weight (e.g. values already decoded).
void rms_norm(const float* x, size_t rows, size_t dim, const float* weight, float eps, float* y);

// The statistic alone: rsqrt(mean(x^2) + eps) over n values, f32 (used by hc mixes / Engram).
float rms_rsqrt(const float* x, size_t n, float eps);

namespace ref {
void rms_norm(const float* x, size_t rows, size_t dim, const float* weight, float eps, float* y);
float rms_rsqrt(const float* x, size_t n, float eps);
}  // namespace ref

}  // namespace cedar::ops
