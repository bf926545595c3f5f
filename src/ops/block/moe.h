// MoE routing and the clamped SwiGLU of the V4.1 experts (spec §4.7; model.py Gate / Expert / MoE).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops {

inline constexpr float kRouteNormEps = 1e-20f;

// sqrt(softplus(x)) with torch's softplus (beta 1, threshold 20: x > 20 -> x, else log1p(exp(x))
// evaluated in double and rounded once, exact_math.h), then an f32 sqrt.
float sqrt_softplus(float x);

// Router for one token. logits [n_experts] = f32(x) · f32(W_gate)ᵀ (use linear_bf16 with LinearOut::kF32).
//   score_e = sqrt_softplus(logits_e)                          (gate_temp = 1)
//   select  = top_k of (score_e + bias_e)   (bias = gate.bias, or gate.bias_vl for image tokens)
//             in descending order of the biased score; ties -> lower expert id first
//   w_i     = score_{select_i};  w_i /= (f32(Σ_i w_i) + 1e-20)  (the sum in float64, rounded once;
//             the add and the division in f32);
//   w_i    *= route_scale
// expert_ids [top_k] / weights [top_k] come out in selection (descending) order, as torch.topk
// returns them. torch.topk's order among equal values is unspecified; cedar picks the lower expert id
// first (deterministic). Exact f32 ties of biased scores essentially never occur with real logits.
// At most 1024 experts (stack buffers; V4.1 has 384).
void route_sqrt_softplus(const float* logits, const float* bias, size_t n_experts, size_t top_k,
                         float route_scale, int32_t* expert_ids, float* weights);

// Clamped SwiGLU activation for n features (Expert.forward):
//   u = clamp(u, -limit, limit);  g = min(g, limit);  a = silu(g) * u;  a = weight * a;  out = bf16(a)
// with silu(g) = g / (1 + exp(-g)) evaluated in double and rounded once (exact_math.h), the rest f32.
// g, u are the (bf16-valued) outputs of w1 and w3. For the shared expert pass weight = 1 (the
// reference skips the multiply; ×1.0f is exact). limit <= 0 disables the clamps (reference:
// swiglu_limit > 0 check). out may alias g or u.
void swiglu_clamped(const float* g, const float* u, size_t n, float limit, float weight, float* out);

namespace fast {
// swiglu_clamped of `--numerics fast`: the same clamps and f32 products, with silu in f32 vectors,
// g · sigmoid(g) where sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) below, e = exp(-|g|) by
// Highway's Exp (at most 1 ulp; never overflows). Before the final bf16 rounding the result is within
// a few f32 ulps of the exact op's, so the outputs are equal or adjacent bf16 values (values below
// 2^-100, where Exp's results are subnormal, within 2^-100). NaN and infinities as in the exact op.
void swiglu_clamped(const float* g, const float* u, size_t n, float limit, float weight, float* out);
}  // namespace fast

}  // namespace cedar::ops
