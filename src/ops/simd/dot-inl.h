// Per-target (Highway) implementation of the canonical float64 dot product of dot_canonical.h.
// Include inside a file compiled through foreach_target.h, after "hwy/highway.h".
#if defined(CEDAR_OPS_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CEDAR_OPS_DOT_INL_H_
#undef CEDAR_OPS_DOT_INL_H_
#else
#define CEDAR_OPS_DOT_INL_H_
#endif

#include <cstdint>
#include <cstring>

#include "hwy/highway.h"
#include "ops/simd/dot_canonical.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 8 f64 lanes so that 32 is a multiple of the vector width on every x86 target (1, 2, 4, 8).
using DotTagD = hn::CappedTag<double, 8>;
using DotVecD = hn::Vec<DotTagD>;
// fp32 vectors with the same lane count (half width), promoted to f64 after loading.
using DotTagF = hn::Rebind<float, DotTagD>;

HWY_INLINE DotVecD LoadF32AsF64(DotTagD dd, const float* p) { return hn::PromoteTo(dd, hn::LoadU(DotTagF(), p)); }

HWY_INLINE DotVecD LoadBf16AsF64(DotTagD dd, const uint16_t* p) {
  const DotTagF df;
  const hn::RebindToUnsigned<DotTagF> du;
  const hn::Rebind<uint16_t, DotTagF> d16;
  return hn::PromoteTo(dd, hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p)))));
}

// Canonical float64 dot of a[k] with b[k]; B is float or uint16_t (bf16 bits). Every product is exact
// in float64, so the fused multiply-add rounds exactly like the scalar product-then-add.
template <typename B>
HWY_INLINE double DotCanonicalF64(const float* a, const B* b, size_t k) {
  const DotTagD dd;
  const size_t n = hn::Lanes(dd);
  const size_t nvec = kDotLanes / n;  // 4 (AVX-512), 8 (AVX2), 16 (SSE4), 32 (scalar)
  DotVecD acc[kDotLanes];
  for (size_t v = 0; v < nvec; ++v) acc[v] = hn::Zero(dd);
  const auto load_b = [&](const B* p) {
    if constexpr (sizeof(B) == 2) {
      return LoadBf16AsF64(dd, p);
    } else {
      return LoadF32AsF64(dd, p);
    }
  };
  const auto accumulate = [&](const float* pa, const B* pb) {
    for (size_t v = 0; v < nvec; ++v) acc[v] = hn::MulAdd(LoadF32AsF64(dd, pa + v * n), load_b(pb + v * n), acc[v]);
  };
  size_t i = 0;
  for (; i + kDotLanes <= k; i += kDotLanes) accumulate(a + i, b + i);
  if (i < k) {
    // Tail: zero-padded copies; a +0 product leaves a lane sum unchanged (lane sums are never -0).
    HWY_ALIGN float ta[kDotLanes] = {};
    HWY_ALIGN B tb[kDotLanes] = {};
    std::memcpy(ta, a + i, (k - i) * sizeof(float));
    std::memcpy(tb, b + i, (k - i) * sizeof(B));
    accumulate(ta, tb);
  }
  // Halving fold: vector pairs first (lanes l and l + w with w >= n live in different vectors).
  for (size_t w = nvec / 2; w >= 1; w /= 2) {
    for (size_t v = 0; v < w; ++v) acc[v] = hn::Add(acc[v], acc[v + w]);
  }
  HWY_ALIGN double lanes[8];
  hn::Store(acc[0], dd, lanes);
  for (size_t w = n / 2; w >= 1; w /= 2) {
    for (size_t j = 0; j < w; ++j) lanes[j] += lanes[j + w];
  }
  return lanes[0];
}

// Canonical float64 sum of the fp32-rounded products a[i]*b[i] (dot_rounded_products_f64), e.g. the
// sum of squares of RMSNorm (a == b).
HWY_INLINE double SumRoundedProductsF64(const float* a, const float* b, size_t k) {
  const DotTagD dd;
  const DotTagF df;
  const size_t n = hn::Lanes(dd);
  const size_t nvec = kDotLanes / n;
  DotVecD acc[kDotLanes];
  for (size_t v = 0; v < nvec; ++v) acc[v] = hn::Zero(dd);
  const auto accumulate = [&](const float* pa, const float* pb) {
    for (size_t v = 0; v < nvec; ++v) {
      const auto p = hn::Mul(hn::LoadU(df, pa + v * n), hn::LoadU(df, pb + v * n));  // fp32 product
      acc[v] = hn::Add(acc[v], hn::PromoteTo(dd, p));
    }
  };
  size_t i = 0;
  for (; i + kDotLanes <= k; i += kDotLanes) accumulate(a + i, b + i);
  if (i < k) {
    HWY_ALIGN float ta[kDotLanes] = {};
    HWY_ALIGN float tb[kDotLanes] = {};
    std::memcpy(ta, a + i, (k - i) * sizeof(float));
    std::memcpy(tb, b + i, (k - i) * sizeof(float));
    accumulate(ta, tb);
  }
  for (size_t w = nvec / 2; w >= 1; w /= 2) {
    for (size_t v = 0; v < w; ++v) acc[v] = hn::Add(acc[v], acc[v + w]);
  }
  HWY_ALIGN double lanes[8];
  hn::Store(acc[0], dd, lanes);
  for (size_t w = n / 2; w >= 1; w /= 2) {
    for (size_t j = 0; j < w; ++j) lanes[j] += lanes[j + w];
  }
  return lanes[0];
}

// Canonical float64 dot of bf16-valued activations a[k] with bf16 weights b[k] (bits): the products are
// formed in fp32, where bf16 x bf16 is exact (16 significant bits), in vectors of up to 16 lanes, and
// each product vector is promoted to f64 in two halves that land in the canonical lanes. Equals
// dot_rounded_products_f64 (scalar) bit for bit, and the exact-product dot for bf16 activations.
HWY_INLINE double DotBf16WeightsF64(const float* a, const uint16_t* b, size_t k) {
#if HWY_TARGET == HWY_SCALAR
  double s[kDotLanes] = {};
  for (size_t i = 0; i < k; ++i) {
    const uint32_t bits = static_cast<uint32_t>(b[i]) << 16;
    float w;
    std::memcpy(&w, &bits, 4);
    s[i % kDotLanes] += static_cast<double>(a[i] * w);
  }
  return fold_dot_lanes(s);
#else
  using DF = hn::CappedTag<float, 16>;
  const DF df;
  const hn::Half<DF> dh;
  const hn::Rebind<double, decltype(dh)> dd;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  const size_t nf = hn::Lanes(df);
  const size_t n = nf / 2;              // f64 lanes per vector
  const size_t nvec = kDotLanes / n;    // 4 (AVX-512), 8 (AVX2), 16 (SSE4)
  hn::Vec<decltype(dd)> acc[kDotLanes];
  for (size_t v = 0; v < nvec; ++v) acc[v] = hn::Zero(dd);
  const auto accumulate = [&](const float* pa, const uint16_t* pb) {
    for (size_t c = 0; c < nvec / 2; ++c) {
      const auto w = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, pb + c * nf))));
      const auto p = hn::Mul(hn::LoadU(df, pa + c * nf), w);
      acc[2 * c] = hn::Add(acc[2 * c], hn::PromoteTo(dd, hn::LowerHalf(dh, p)));
      acc[2 * c + 1] = hn::Add(acc[2 * c + 1], hn::PromoteTo(dd, hn::UpperHalf(dh, p)));
    }
  };
  size_t i = 0;
  for (; i + 2 * kDotLanes <= k; i += 2 * kDotLanes) {  // unrolled: more loads in flight, same order
    accumulate(a + i, b + i);
    accumulate(a + i + kDotLanes, b + i + kDotLanes);
  }
  for (; i + kDotLanes <= k; i += kDotLanes) accumulate(a + i, b + i);
  if (i < k) {
    HWY_ALIGN float ta[kDotLanes] = {};
    HWY_ALIGN uint16_t tb[kDotLanes] = {};
    std::memcpy(ta, a + i, (k - i) * sizeof(float));
    std::memcpy(tb, b + i, (k - i) * sizeof(uint16_t));
    accumulate(ta, tb);
  }
  for (size_t w = nvec / 2; w >= 1; w /= 2) {
    for (size_t v = 0; v < w; ++v) acc[v] = hn::Add(acc[v], acc[v + w]);
  }
  HWY_ALIGN double lanes[8];
  hn::Store(acc[0], dd, lanes);
  for (size_t w = n / 2; w >= 1; w /= 2) {
    for (size_t j = 0; j < w; ++j) lanes[j] += lanes[j + w];
  }
  return lanes[0];
#endif
}

// The contract's fp32 dot: the canonical float64 dot rounded once.
template <typename B>
HWY_INLINE float DotCanonical(const float* a, const B* b, size_t k) {
  return static_cast<float>(DotCanonicalF64(a, b, k));
}

// Σ a[i]·b[i] in fp32: two chains of fused multiply-adds, then the lanes. A plain fp32 dot (fast
// numerics); where every partial sum is exact in fp32, in any order, it equals the exact dot.
HWY_INLINE float DotF32(const float* a, const float* b, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + i + lanes), hn::LoadU(df, b + i + lanes), acc1);
  }
  for (; i + lanes <= n; i += lanes) acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
