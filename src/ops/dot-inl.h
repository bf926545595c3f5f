// Per-target (Highway) implementation of the canonical dot product of dot_canonical.h.
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
#include "ops/dot_canonical.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 lanes so that 64 is a multiple of the vector width on every x86 target.
using DotTag = hn::CappedTag<float, 16>;
using DotVec = hn::Vec<DotTag>;

HWY_INLINE DotVec LoadBf16AsF32(DotTag df, const uint16_t* p) {
  const hn::RebindToUnsigned<DotTag> du;
  const hn::Rebind<uint16_t, DotTag> d16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
}

// Canonical dot of a[k] with b[k]; B is float or uint16_t (bf16 bits). kExactProducts selects a
// fused multiply-add (only valid when every product is exact in f32, e.g. bf16 x bf16).
template <bool kExactProducts, typename B>
HWY_INLINE float DotCanonical(const float* a, const B* b, size_t k) {
  const DotTag df;
  const size_t n = hn::Lanes(df);
  const size_t nvec = kDotLanes / n;  // 4 (AVX-512), 8 (AVX2), 16 (SSE4); more on narrower targets
  DotVec acc[kDotLanes];
  for (size_t v = 0; v < nvec; ++v) acc[v] = hn::Zero(df);
  const auto load_b = [&](const B* p) {
    if constexpr (sizeof(B) == 2) {
      return LoadBf16AsF32(df, p);
    } else {
      return hn::LoadU(df, p);
    }
  };
  const auto accumulate = [&](const float* pa, const B* pb) {
    for (size_t v = 0; v < nvec; ++v) {
      const DotVec x = hn::LoadU(df, pa + v * n);
      const DotVec y = load_b(pb + v * n);
      if constexpr (kExactProducts) {
        acc[v] = hn::MulAdd(x, y, acc[v]);
      } else {
        acc[v] = hn::Add(acc[v], hn::Mul(x, y));
      }
    }
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
  HWY_ALIGN float lanes[kDotLanes];
  hn::Store(acc[0], df, lanes);
  for (size_t w = n / 2; w >= 1; w /= 2) {
    for (size_t j = 0; j < w; ++j) lanes[j] += lanes[j + w];
  }
  return lanes[0];
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
