// MoE router and clamped SwiGLU (moe.h). The router is scalar (a few hundred values per token); the
// exact SwiGLU is scalar with silu in double, the fast one Highway vectors in f32 (the SwiGLU of every
// selected expert: thousands of values per token and layer).
#include "ops/block/moe.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "ops/simd/exact_math.h"
#include "ops/formats/formats.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/block/moe.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "ops/simd/bf16_round-inl.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// fast::swiglu_clamped on one vector. The clamps are written as std::min / std::max evaluate them
// ((b < a) ? b : a), so a NaN g or u stays NaN as in the exact op.
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE VF SwigluVec(DF df, VF g, VF u, float limit, VF weight) {
  if (limit > 0.0f) {
    const VF hi = hn::Set(df, limit), lo = hn::Set(df, -limit);
    u = hn::IfThenElse(hn::Lt(u, lo), lo, u);
    u = hn::IfThenElse(hn::Lt(hi, u), hi, u);
    g = hn::IfThenElse(hn::Lt(hi, g), hi, g);
  }
  const VF one = hn::Set(df, 1.0f);
  const VF e = hn::Exp(df, hn::Neg(hn::Abs(g)));  // in (0, 1]: no overflow
  const VF den = hn::Add(one, e);
  const VF sigmoid = hn::IfThenElse(hn::Ge(g, hn::Zero(df)), hn::Div(one, den), hn::Div(e, den));
  return RoundBf16(df, hn::Mul(weight, hn::Mul(hn::Mul(g, sigmoid), u)));
}

void SwigluClampedFast(const float* g, const float* u, size_t n, float limit, float weight, float* out) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const auto w = hn::Set(df, weight);
  size_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(SwigluVec(df, hn::LoadU(df, g + i), hn::LoadU(df, u + i), limit, w), df, out + i);
  if (i < n) {  // the tail through a padded vector, so every element takes the same arithmetic
    HWY_ALIGN float gt[HWY_MAX_BYTES / sizeof(float)] = {}, ut[HWY_MAX_BYTES / sizeof(float)] = {},
                                                              ot[HWY_MAX_BYTES / sizeof(float)];
    std::copy(g + i, g + n, gt);
    std::copy(u + i, u + n, ut);
    hn::Store(SwigluVec(df, hn::Load(df, gt), hn::Load(df, ut), limit, w), df, ot);
    std::copy(ot, ot + (n - i), out + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {

HWY_EXPORT(SwigluClampedFast);

void fast::swiglu_clamped(const float* g, const float* u, size_t n, float limit, float weight, float* out) {
  HWY_DYNAMIC_DISPATCH(SwigluClampedFast)(g, u, n, limit, weight, out);
}

float sqrt_softplus(float x) {
  // torch.nn.functional.softplus(beta=1, threshold=20), in double below the threshold; f32 sqrt
  // (correctly rounded, like torch's).
  return std::sqrt(softplus_f32(x));
}

void route_sqrt_softplus(const float* logits, const float* bias, size_t n_experts, size_t top_k,
                         float route_scale, int32_t* expert_ids, float* weights) {
  CEDAR_CHECK(top_k >= 1 && top_k <= n_experts && n_experts <= 1024, "router: top_k %zu of %zu experts",
              top_k, n_experts);
  float score[1024];   // [n_experts] unbiased scores
  float biased[1024];  // [n_experts] selection keys
  int32_t order[1024];
  for (size_t e = 0; e < n_experts; ++e) {
    score[e] = sqrt_softplus(logits[e]);
    biased[e] = score[e] + bias[e];
    order[e] = static_cast<int32_t>(e);
  }
  // Descending biased score, lower expert id first on ties; NaN ranks first (torch.topk's NaN rule).
  const auto before = [&](int32_t a, int32_t b) {
    const bool na = std::isnan(biased[a]);
    const bool nb = std::isnan(biased[b]);
    if (na != nb) return na;
    if (!na && biased[a] != biased[b]) return biased[a] > biased[b];
    return a < b;
  };
  std::partial_sort(order, order + top_k, order + n_experts, before);
  double sum = 0.0;  // a sum feeding a division: float64, rounded once (numerics contract)
  for (size_t i = 0; i < top_k; ++i) {
    expert_ids[i] = order[i];
    weights[i] = score[order[i]];
    sum += weights[i];
  }
  if (top_k > 1) {  // the reference normalises only when more than one expert is active
    const float den = static_cast<float>(sum) + kRouteNormEps;
    for (size_t i = 0; i < top_k; ++i) weights[i] /= den;
  }
  for (size_t i = 0; i < top_k; ++i) weights[i] *= route_scale;
}

void swiglu_clamped(const float* g, const float* u, size_t n, float limit, float weight, float* out) {
  for (size_t i = 0; i < n; ++i) {
    float up = u[i];
    float gate = g[i];
    if (limit > 0.0f) {
      up = std::min(std::max(up, -limit), limit);
      gate = std::min(gate, limit);
    }
    const float silu = silu_f32(gate);
    const float a = silu * up;
    out[i] = round_bf16(weight * a);
  }
}

}  // namespace cedar::ops
#endif  // HWY_ONCE
