// RMSNorm (norm.h). The sum of squares is the only reduction; it uses the canonical float64 order
// (dot_canonical.h), SIMD in the fast path, scalar in ref::.
#include "ops/block/norm.h"

#include "ops/simd/dot_canonical.h"
#include "ops/simd/exact_math.h"
#include "ops/formats/formats.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/block/norm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "ops/simd/dot-inl.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {

double SumSquares(const float* x, size_t n) { return SumRoundedProductsF64(x, x, n); }

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {
HWY_EXPORT(SumSquares);

namespace {

// r = rsqrt(mean + eps) from the float64 sum of squares of n values.
inline float rms_rsqrt_from_sum(double sum_of_squares, size_t n, float eps) {
  return rsqrt_f32(mean_square_f32(sum_of_squares, n) + eps);
}

template <typename WeightAt>
void rms_norm_impl(const float* x, size_t rows, size_t dim, WeightAt weight_at, float eps, float* y,
                   bool simd) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;  // [dim]
    float* yr = y + r * dim;        // [dim]
    const double ss = simd ? HWY_DYNAMIC_DISPATCH(SumSquares)(xr, dim) : dot_rounded_products_f64(xr, xr, dim);
    const float inv = rms_rsqrt_from_sum(ss, dim, eps);
    for (size_t i = 0; i < dim; ++i) yr[i] = round_bf16(weight_at(i) * (xr[i] * inv));
  }
}

}  // namespace

void rms_norm(const float* x, size_t rows, size_t dim, const uint16_t* weight_bf16, float eps, float* y) {
  rms_norm_impl(
      x, rows, dim, [&](size_t i) { return bf16_bits_to_f32(weight_bf16[i]); }, eps, y, true);
}

void rms_norm(const float* x, size_t rows, size_t dim, const float* weight, float eps, float* y) {
  rms_norm_impl(
      x, rows, dim, [&](size_t i) { return weight[i]; }, eps, y, true);
}

float rms_rsqrt(const float* x, size_t n, float eps) {
  return rms_rsqrt_from_sum(HWY_DYNAMIC_DISPATCH(SumSquares)(x, n), n, eps);
}

namespace ref {
void rms_norm(const float* x, size_t rows, size_t dim, const float* weight, float eps, float* y) {
  rms_norm_impl(
      x, rows, dim, [&](size_t i) { return weight[i]; }, eps, y, false);
}
float rms_rsqrt(const float* x, size_t n, float eps) {
  return rms_rsqrt_from_sum(dot_rounded_products_f64(x, x, n), n, eps);
}
}  // namespace ref

}  // namespace cedar::ops
#endif  // HWY_ONCE
