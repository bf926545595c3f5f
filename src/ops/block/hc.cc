// mHC helpers (hc.h). hc_mixes is the heavy part (24 dot products of length 20480 per token); it uses
// the canonical float64 dot with Highway. hc_pre and hc_post are element-wise over dim: Highway
// vectors doing the scalar reference's operations in its order (no fused multiply-add), so every
// target gives its bits. Sinkhorn is a few dozen f32 operations per token.
#include "ops/block/hc.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/simd/dot_canonical.h"
#include "ops/simd/exact_math.h"
#include "ops/formats/formats.h"
#include "ops/block/norm.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/block/hc.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "ops/simd/bf16_round-inl.h"
#include "ops/simd/dot-inl.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {

// mixes[j] = dot(x, fn_j) for j in [j_begin, j_end): the exact float64 dot rounded once to fp32.
void HcDots(const float* x, size_t hc_dim, const float* fn, float* mixes, size_t j_begin, size_t j_end) {
  for (size_t j = j_begin; j < j_end; ++j) mixes[j] = DotCanonical(x, fn + j * hc_dim, hc_dim);
}

namespace hn = hwy::HWY_NAMESPACE;

// Fast numerics: mixes[t][j] = Σ x_t·fn_j for tokens [t_begin, t_end) and mixes [j_begin, j_end),
// unscaled, in float64 register tiles of up to 4 tokens x 6 mixes: each x and fn vector is widened
// and loaded once per tile and feeds several fused multiply-adds, where the exact op widens both for
// every single dot. Products of two floats are exact in float64, so only the order of the float64
// additions differs from the exact op; the sum is rounded once to fp32 as there. (fp32 sums were
// tried: the mixes steer the Sinkhorn weights of the residual streams, and on cedar-mini greedy
// agreement with exact fell from 99.05 % to 96.7 %.)
template <size_t TT, size_t TM>
HWY_INLINE void HcDotsTile(const float* x, size_t hc_dim, const float* fn, size_t n_mix, float* mixes, size_t t0,
                           size_t j0) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t N = hn::Lanes(dd);
  hn::Vec<decltype(dd)> acc[TT][TM];
  for (size_t t = 0; t < TT; ++t)
    for (size_t j = 0; j < TM; ++j) acc[t][j] = hn::Zero(dd);
  const size_t whole = hc_dim - hc_dim % N;
  for (size_t i = 0; i < whole; i += N) {
    hn::Vec<decltype(dd)> xv[TT];
    for (size_t t = 0; t < TT; ++t) xv[t] = hn::PromoteTo(dd, hn::LoadU(df, x + (t0 + t) * hc_dim + i));
    for (size_t j = 0; j < TM; ++j) {
      const auto f = hn::PromoteTo(dd, hn::LoadU(df, fn + (j0 + j) * hc_dim + i));
      for (size_t t = 0; t < TT; ++t) acc[t][j] = hn::MulAdd(xv[t], f, acc[t][j]);
    }
  }
  for (size_t t = 0; t < TT; ++t) {
    for (size_t j = 0; j < TM; ++j) {
      double sum = hn::GetLane(hn::SumOfLanes(dd, acc[t][j]));
      for (size_t i = whole; i < hc_dim; ++i)
        sum += static_cast<double>(x[(t0 + t) * hc_dim + i]) * fn[(j0 + j) * hc_dim + i];
      mixes[(t0 + t) * n_mix + j0 + j] = static_cast<float>(sum);
    }
  }
}

template <size_t TT>
HWY_INLINE void HcDotsTokens(const float* x, size_t hc_dim, const float* fn, size_t n_mix, float* mixes, size_t t0,
                             size_t j_begin, size_t j_end) {
  size_t j = j_begin;
  for (; j + 6 <= j_end; j += 6) HcDotsTile<TT, 6>(x, hc_dim, fn, n_mix, mixes, t0, j);
  for (; j < j_end; ++j) HcDotsTile<TT, 1>(x, hc_dim, fn, n_mix, mixes, t0, j);
}

void HcDotsFast(const float* x, size_t hc_dim, const float* fn, size_t n_mix, float* mixes, size_t t_begin,
                size_t t_end, size_t j_begin, size_t j_end) {
  size_t t = t_begin;
  for (; t + 4 <= t_end; t += 4) HcDotsTokens<4>(x, hc_dim, fn, n_mix, mixes, t, j_begin, j_end);
  for (; t < t_end; ++t) HcDotsTokens<1>(x, hc_dim, fn, n_mix, mixes, t, j_begin, j_end);
}

// One token of hc_pre: out[d] = bf16(0 + a_0 x_0[d] + a_1 x_1[d] + ...), d in [0, dim).
void HcPreToken(const float* x, const float* a, size_t hc, size_t dim, float* out) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  size_t d = 0;
  for (; d + N <= dim; d += N) {
    auto sum = hn::Zero(df);
    for (size_t j = 0; j < hc; ++j) sum = hn::Add(sum, hn::Mul(hn::Set(df, a[j]), hn::LoadU(df, x + j * dim + d)));
    hn::StoreU(RoundBf16(df, sum), df, out + d);
  }
  for (; d < dim; ++d) {
    float sum = 0.0f;
    for (size_t j = 0; j < hc; ++j) sum += a[j] * x[j * dim + d];
    out[d] = round_bf16(sum);
  }
}

// One token of hc_post: out[k][d] = bf16(post[k] y[d] + (0 + comb[0][k] r_0[d] + comb[1][k] r_1[d] + ...)).
void HcPostToken(const float* y, const float* r, const float* post, const float* comb, size_t hc, size_t dim,
                 float* out) {
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  for (size_t k = 0; k < hc; ++k) {
    const auto p = hn::Set(df, post[k]);
    size_t d = 0;
    for (; d + N <= dim; d += N) {
      auto mix = hn::Zero(df);
      for (size_t j = 0; j < hc; ++j) mix = hn::Add(mix, hn::Mul(hn::Set(df, comb[j * hc + k]), hn::LoadU(df, r + j * dim + d)));
      hn::StoreU(RoundBf16(df, hn::Add(hn::Mul(p, hn::LoadU(df, y + d)), mix)), df, out + k * dim + d);
    }
    for (; d < dim; ++d) {
      float mix = 0.0f;
      for (size_t j = 0; j < hc; ++j) mix += comb[j * hc + k] * r[j * dim + d];
      out[k * dim + d] = round_bf16(post[k] * y[d] + mix);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {
HWY_EXPORT(HcDots);
HWY_EXPORT(HcDotsFast);
HWY_EXPORT(HcPreToken);
HWY_EXPORT(HcPostToken);

void hc_mixes(const float* x, size_t n_tokens, size_t hc_dim, const float* fn, size_t n_mix, float norm_eps,
              float* mixes, ThreadPool* pool) {
  const auto one_token = [&](size_t t, size_t j_begin, size_t j_end) {
    HWY_DYNAMIC_DISPATCH(HcDots)(x + t * hc_dim, hc_dim, fn, mixes + t * n_mix, j_begin, j_end);
  };
  const bool parallel = pool != nullptr && pool->size() > 1;
  if (parallel && n_tokens > 1) {
    pool->parallel_for(n_tokens, 1, [&](size_t b, size_t e, int) {
      for (size_t t = b; t < e; ++t) one_token(t, 0, n_mix);
    });
  } else {
    for (size_t t = 0; t < n_tokens; ++t) {
      if (parallel) {
        pool->parallel_for(n_mix, 1, [&](size_t b, size_t e, int) { one_token(t, b, e); });
      } else {
        one_token(t, 0, n_mix);
      }
    }
  }
  for (size_t t = 0; t < n_tokens; ++t) {
    const float r = rms_rsqrt(x + t * hc_dim, hc_dim, norm_eps);
    for (size_t j = 0; j < n_mix; ++j) mixes[t * n_mix + j] *= r;  // [n_mix] row of token t
  }
}

void fast::hc_mixes(const float* x, size_t n_tokens, size_t hc_dim, const float* fn, size_t n_mix, float norm_eps,
                    float* mixes, ThreadPool* pool) {
  const bool parallel = pool != nullptr && pool->size() > 1;
  if (parallel && n_tokens > 1) {
    pool->parallel_for(n_tokens, 4, [&](size_t b, size_t e, int) {
      HWY_DYNAMIC_DISPATCH(HcDotsFast)(x, hc_dim, fn, n_mix, mixes, b, e, 0, n_mix);
    });
  } else if (parallel) {
    pool->parallel_for(n_mix, 6, [&](size_t b, size_t e, int) {
      HWY_DYNAMIC_DISPATCH(HcDotsFast)(x, hc_dim, fn, n_mix, mixes, 0, n_tokens, b, e);
    });
  } else {
    HWY_DYNAMIC_DISPATCH(HcDotsFast)(x, hc_dim, fn, n_mix, mixes, 0, n_tokens, 0, n_mix);
  }
  for (size_t t = 0; t < n_tokens; ++t) {
    const float r = rms_rsqrt(x + t * hc_dim, hc_dim, norm_eps);
    for (size_t j = 0; j < n_mix; ++j) mixes[t * n_mix + j] *= r;
  }
}

void hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, int hc_mult, int iters,
                       float eps, float* pre, float* post, float* comb) {
  CEDAR_CHECK(hc_mult > 0 && hc_mult <= 16, "hc_mult %d out of range", hc_mult);
  CEDAR_CHECK(iters >= 1, "sinkhorn iterations must be >= 1, got %d", iters);
  const int hc = hc_mult;
  for (int j = 0; j < hc; ++j) pre[j] = sigmoid_f32(mixes[j] * scale[0] + base[j]) + eps;
  for (int j = 0; j < hc; ++j) post[j] = 2.0f * sigmoid_f32(mixes[hc + j] * scale[1] + base[hc + j]);
  // comb[j][k] (row j, column k): softmax over k, then + eps.
  for (int j = 0; j < hc; ++j) {
    float* row = comb + j * hc;
    for (int k = 0; k < hc; ++k) row[k] = mixes[2 * hc + j * hc + k] * scale[2] + base[2 * hc + j * hc + k];
    float row_max = row[0];
    for (int k = 1; k < hc; ++k) row_max = std::max(row_max, row[k]);
    float sum = 0.0f;
    for (int k = 0; k < hc; ++k) {
      row[k] = exp_f32(row[k] - row_max);
      sum += row[k];
    }
    for (int k = 0; k < hc; ++k) row[k] = row[k] / sum + eps;
  }
  const auto normalise_columns = [&] {
    for (int k = 0; k < hc; ++k) {
      float sum = 0.0f;
      for (int j = 0; j < hc; ++j) sum += comb[j * hc + k];
      const float den = sum + eps;
      for (int j = 0; j < hc; ++j) comb[j * hc + k] /= den;
    }
  };
  const auto normalise_rows = [&] {
    for (int j = 0; j < hc; ++j) {
      float sum = 0.0f;
      for (int k = 0; k < hc; ++k) sum += comb[j * hc + k];
      const float den = sum + eps;
      for (int k = 0; k < hc; ++k) comb[j * hc + k] /= den;
    }
  };
  normalise_columns();
  for (int it = 0; it < iters - 1; ++it) {
    normalise_rows();
    normalise_columns();
  }
}

void hc_pre(const float* x, const float* a, size_t n_tokens, int hc_mult, size_t dim, float* out) {
  const size_t hc = static_cast<size_t>(hc_mult);
  for (size_t t = 0; t < n_tokens; ++t)
    HWY_DYNAMIC_DISPATCH(HcPreToken)(x + t * hc * dim, a + t * hc, hc, dim, out + t * dim);
}

void hc_post(const float* y, const float* residual, const float* post, const float* comb, size_t n_tokens,
             int hc_mult, size_t dim, float* out) {
  const size_t hc = static_cast<size_t>(hc_mult);
  for (size_t t = 0; t < n_tokens; ++t)
    HWY_DYNAMIC_DISPATCH(HcPostToken)(y + t * dim, residual + t * hc * dim, post + t * hc, comb + t * hc * hc, hc,
                                      dim, out + t * hc * dim);
}

namespace ref {
void hc_pre(const float* x, const float* a, size_t n_tokens, int hc_mult, size_t dim, float* out) {
  for (size_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * hc_mult * dim;  // [hc, dim]
    const float* at = a + t * hc_mult;        // [hc]
    float* ot = out + t * dim;                // [dim]
    for (size_t d = 0; d < dim; ++d) {
      float sum = 0.0f;
      for (int j = 0; j < hc_mult; ++j) sum += at[j] * xt[j * dim + d];
      ot[d] = round_bf16(sum);
    }
  }
}

void hc_post(const float* y, const float* residual, const float* post, const float* comb, size_t n_tokens,
             int hc_mult, size_t dim, float* out) {
  const size_t hc = static_cast<size_t>(hc_mult);
  for (size_t t = 0; t < n_tokens; ++t) {
    const float* yt = y + t * dim;              // [dim]
    const float* rt = residual + t * hc * dim;  // [hc, dim]
    const float* pt = post + t * hc;            // [hc]
    const float* ct = comb + t * hc * hc;       // [hc, hc]
    float* ot = out + t * hc * dim;             // [hc, dim]
    for (size_t k = 0; k < hc; ++k) {
      for (size_t d = 0; d < dim; ++d) {
        float mix = 0.0f;
        for (size_t j = 0; j < hc; ++j) mix += ct[j * hc + k] * rt[j * dim + d];
        ot[k * dim + d] = round_bf16(pt[k] * yt[d] + mix);
      }
    }
  }
}

void hc_mixes(const float* x, size_t n_tokens, size_t hc_dim, const float* fn, size_t n_mix, float norm_eps,
              float* mixes) {
  for (size_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * hc_dim;
    const float r = ref::rms_rsqrt(xt, hc_dim, norm_eps);
    for (size_t j = 0; j < n_mix; ++j) mixes[t * n_mix + j] = dot_canonical(xt, fn + j * hc_dim, hc_dim) * r;
  }
}
}  // namespace ref

}  // namespace cedar::ops
#endif  // HWY_ONCE
