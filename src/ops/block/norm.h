// RMSNorm as the V4.1 reference computes it (spec §2.4; model.py RMSNorm.forward), under the numerics
// contract (docs/NUMERICS.md §1):
//   var  = f32( (Σ_k f32(x_k^2)) / dim )           fp32 squares (x.square()) summed in float64 (canonical
//                                                  order of dot_canonical.h), divided in float64, rounded
//                                                  once (exact squares for bf16 x)
//   r    = f32( 1 / sqrt(f64(var + eps)) )         var + eps in f32, the rsqrt in double, rounded once
//   y_k  = bf16( fp32(w_k) * (x_k * r) )           f32 products; the weight multiplies AFTER normalising
// eps is 1e-20 for every V4.1 norm. Output values are bf16-representable floats. The SIMD path and the
// scalar reference (ref::rms_norm) are bit-identical (same float64 lane order).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops {

inline constexpr float kRmsNormEpsV41 = 1e-20f;

// x, y: [rows, dim] (y may alias x). weight: [dim] as bf16 bits (checkpoint layout).
void rms_norm(const float* x, size_t rows, size_t dim, const uint16_t* weight_bf16, float eps, float* y);
// Same with an f32 weight (e.g. values already decoded).
void rms_norm(const float* x, size_t rows, size_t dim, const float* weight, float eps, float* y);

// The statistic alone: r = rsqrt(mean(x^2) + eps) over n values as above (used by hc mixes / Engram).
float rms_rsqrt(const float* x, size_t n, float eps);

namespace ref {
void rms_norm(const float* x, size_t rows, size_t dim, const float* weight, float eps, float* y);
float rms_rsqrt(const float* x, size_t n, float eps);
}  // namespace ref

}  // namespace cedar::ops
