// Manifold-constrained hyper-connections (mHC) helpers (spec §2.7, §4.2; model.py Block.hc_* and
// kernel.py hc_split_sinkhorn). V4.1: hc_mult = 4 streams of dim 5120, 24 mixes, 20 Sinkhorn
// iterations, hc_eps 1e-6, statistic eps = norm_eps = 1e-20. f32 values under the numerics contract
// (docs/NUMERICS.md §1).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar {
class ThreadPool;
}

namespace cedar::ops {

inline constexpr int kHcMult = 4;
inline constexpr int kHcMixes = (2 + kHcMult) * kHcMult;  // 24
inline constexpr float kHcEps = 1e-6f;
inline constexpr float kHcNormEps = 1e-20f;

// mixes [n_tokens, n_mix] = (X_t · fnᵀ) * rsqrt(mean(X_t^2) + norm_eps), per token t:
//   x  [n_tokens, hc_dim]  bf16 values (the hc_mult streams flattened, hc_dim = hc_mult*dim)
//   fn [n_mix, hc_dim]     f32 (hc_attn_fn / hc_ffn_fn)
// One statistic per token over all hc_dim values (rms_rsqrt, norm.h). Each X_t · fn_j is the contract's
// exact dot (float64, canonical order of dot_canonical.h) rounded once to fp32, then multiplied by the
// statistic in fp32, so the fast path equals ref::hc_mixes bit for bit on every target. `pool` splits
// tokens (prefill) or, for one token, the mixes.
void hc_mixes(const float* x, size_t n_tokens, size_t hc_dim, const float* fn, size_t n_mix, float norm_eps,
              float* mixes, ThreadPool* pool);

namespace fast {
// hc_mixes of `--numerics fast`: each X_t · fn_j summed in float64 register tiles of tokens x mixes
// (exact products, another order of the float64 additions), rounded once to fp32, times the same
// statistic. Within (hc_dim + 1) · 2^-53 · r · Σ|x·fn| plus an fp32 rounding of each side of
// ops::hc_mixes (docs/NUMERICS.md §10): almost always the same bits.
void hc_mixes(const float* x, size_t n_tokens, size_t hc_dim, const float* fn, size_t n_mix, float norm_eps,
              float* mixes, ThreadPool* pool);
}  // namespace fast

// Splits one token's mixes [(2+hc)*hc] into pre [hc], post [hc], comb [hc*hc] (row-major comb[j][k]):
//   pre_j  = sigmoid(m_j * s0 + b_j) + eps
//   post_j = 2 * sigmoid(m_{hc+j} * s1 + b_{hc+j})
//   C[j][k] = m_{2hc + j*hc + k} * s2 + b_{2hc + j*hc + k}
//   C = exp(C - rowmax) / rowsum + eps         (softmax over k, then + eps)
//   C = C / (colsum + eps)
//   repeat iters-1 times: C = C / (rowsum + eps); C = C / (colsum + eps)
// Everything in f32 in this order, except sigmoid and exp, which are evaluated in double and rounded
// once (exact_math.h); row and column sums add left to right. scale [3], base [(2+hc)*hc].
void hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, int hc_mult, int iters,
                       float eps, float* pre, float* post, float* comb);

// hc_pre: out [n_tokens, dim] = bf16( Σ_j a[t][j] * X[t][j] ), j = 0..hc-1 summed in order in f32.
//   x [n_tokens, hc, dim], a [n_tokens, hc] f32.
void hc_pre(const float* x, const float* a, size_t n_tokens, int hc_mult, size_t dim, float* out);

// hc_post: out[t][k] = bf16( post[t][k] * y[t] + (Σ_j comb[t][j][k] * residual[t][j]) ), the j-sum in
// order in f32 first, then added to the post term.
//   y [n_tokens, dim], residual [n_tokens, hc, dim], post [n_tokens, hc], comb [n_tokens, hc, hc],
//   out [n_tokens, hc, dim] (must not alias residual).
void hc_post(const float* y, const float* residual, const float* post, const float* comb, size_t n_tokens,
             int hc_mult, size_t dim, float* out);

// The plain scalar references of hc_mixes, hc_pre and hc_post (the ops above must equal them bit for bit).
namespace ref {
void hc_mixes(const float* x, size_t n_tokens, size_t hc_dim, const float* fn, size_t n_mix, float norm_eps,
              float* mixes);
void hc_pre(const float* x, const float* a, size_t n_tokens, int hc_mult, size_t dim, float* out);
void hc_post(const float* y, const float* residual, const float* post, const float* comb, size_t n_tokens,
             int hc_mult, size_t dim, float* out);
}  // namespace ref

}  // namespace cedar::ops
