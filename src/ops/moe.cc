// MoE router and clamped SwiGLU (moe.h), scalar: a few hundred values per token.
#include "ops/moe.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "ops/exact_math.h"
#include "ops/formats.h"

namespace cedar::ops {

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
