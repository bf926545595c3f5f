// fast::sparse_attn (attention.h), the attention of `--numerics fast`: the exact op's blocks of 64 and
// online softmax, with the sums in fp32 registers and the exponentials in f32 vectors. The semantics
// stay: the same scores scaled in f32, the same running maximum, p rounded to bf16 before P·V, the
// sink in the denominator, a bf16 output. What changes is rounding only (docs/NUMERICS.md §10).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/attention.h"
#include "ops/formats.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/attention_fast.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "ops/bf16_round-inl.h"
#include "ops/attention_block-inl.h"
#include "ops/dot-inl.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void FastSparseAttnHeads(const float* q, size_t head_dim, const KvRows* kv_ptr, const float* sink,
                         const int32_t* idx, size_t n_idx, float scale, float* out, size_t h_begin, size_t h_end) {
  const KvRows& kv = *kv_ptr;
  const hn::ScalableTag<float> df;
  const size_t N = hn::Lanes(df);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Scores padded to whole vectors with -inf (exp gives 0 there).
  constexpr size_t kPadded = kSparseAttnBlock + HWY_MAX_BYTES / sizeof(float);
  HWY_ALIGN float score[kPadded];
  HWY_ALIGN float p[kPadded];
  HWY_ALIGN float block_pv[kSparseAttnMaxHeadDim];  // [head_dim] this block's Σ_j bf16(p_j)·v_j
  const size_t whole_dim = head_dim - head_dim % N;
  for (size_t h = h_begin; h < h_end; ++h) {
    const float* qh = q + h * head_dim;
    float* acc = out + h * head_dim;  // [head_dim] numerator, kept in the output row until the end
    std::fill(acc, acc + head_dim, 0.0f);
    float running_max = kSparseAttnMaxInit;
    float den = 0.0f;
    for (size_t start = 0; start < n_idx; start += kSparseAttnBlock) {
      const size_t nb = std::min(kSparseAttnBlock, n_idx - start);
      const size_t nb_padded = (nb + N - 1) / N * N;
      const float* rows[kSparseAttnBlock];
      const float block_max = SparseAttnBlockScores(
          qh, kv, idx + start, nb, head_dim, scale,
          [](const float* a, const float* b, size_t n) { return DotF32(a, b, n); }, rows, score);
      std::fill(score + nb, score + nb_padded, neg_inf);
      const float new_max = std::max(running_max, block_max);
      const float alpha = std::exp(running_max - new_max);
      const auto vmax = hn::Set(df, new_max);
      auto p_sum = hn::Zero(df);
      for (size_t j = 0; j < nb_padded; j += N) {
        const auto pj = hn::Exp(df, hn::Sub(hn::Load(df, score + j), vmax));
        hn::Store(pj, df, p + j);
        p_sum = hn::Add(p_sum, pj);
      }
      // Σ_j bf16(p_j)·v_j over the rows that contribute, j in order for every element. Elements
      // outside, rows inside: a chunk of the sum stays in registers across the rows (rows outside
      // made every row's adds wait on the previous row's stores to block_pv).
      const float* pv_rows[kSparseAttnBlock];
      float pv_weight[kSparseAttnBlock];
      size_t n_pv = 0;
      for (size_t j = 0; j < nb; ++j) {
        const float pb = rows[j] == nullptr ? 0.0f : round_bf16(p[j]);
        if (pb == 0.0f) continue;
        pv_rows[n_pv] = rows[j];
        pv_weight[n_pv++] = pb;
      }
      constexpr size_t kChunkVecs = 4;
      size_t e = 0;
      for (; e + kChunkVecs * N <= whole_dim; e += kChunkVecs * N) {
        hn::Vec<decltype(df)> sum[kChunkVecs];
        for (auto& v : sum) v = hn::Zero(df);
        for (size_t i = 0; i < n_pv; ++i) {
          const auto pv = hn::Set(df, pv_weight[i]);
          for (size_t c = 0; c < kChunkVecs; ++c) sum[c] = hn::MulAdd(pv, hn::LoadU(df, pv_rows[i] + e + c * N), sum[c]);
        }
        for (size_t c = 0; c < kChunkVecs; ++c) hn::Store(sum[c], df, block_pv + e + c * N);
      }
      for (; e < whole_dim; e += N) {
        auto sum = hn::Zero(df);
        for (size_t i = 0; i < n_pv; ++i) sum = hn::MulAdd(hn::Set(df, pv_weight[i]), hn::LoadU(df, pv_rows[i] + e), sum);
        hn::Store(sum, df, block_pv + e);
      }
      for (; e < head_dim; ++e) {
        block_pv[e] = 0.0f;
        for (size_t i = 0; i < n_pv; ++i) block_pv[e] += pv_weight[i] * pv_rows[i][e];
      }
      den = den * alpha + hn::GetLane(hn::SumOfLanes(df, p_sum));
      const auto va = hn::Set(df, alpha);
      size_t d = 0;
      for (; d < whole_dim; d += N)
        hn::StoreU(hn::MulAdd(hn::LoadU(df, acc + d), va, hn::Load(df, block_pv + d)), df, acc + d);
      for (; d < head_dim; ++d) acc[d] = acc[d] * alpha + block_pv[d];
      running_max = new_max;
    }
    den += std::exp(sink[h] - running_max);
    const auto vden = hn::Set(df, den);
    size_t d = 0;
    for (; d < whole_dim; d += N) hn::StoreU(RoundBf16(df, hn::Div(hn::LoadU(df, acc + d), vden)), df, acc + d);
    for (; d < head_dim; ++d) acc[d] = round_bf16(acc[d] / den);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {

HWY_EXPORT(FastSparseAttnHeads);

void fast::sparse_attn(const float* q, size_t n_heads, size_t head_dim, const KvRows& kv, const float* sink,
                       const int32_t* idx, size_t n_idx, float scale, float* out, ThreadPool* pool) {
  CEDAR_CHECK(head_dim <= kSparseAttnMaxHeadDim, "sparse_attn head_dim %zu > %zu", head_dim, kSparseAttnMaxHeadDim);
  for (size_t i = 0; i < n_idx; ++i) {
    CEDAR_CHECK(idx[i] < 0 || static_cast<size_t>(idx[i]) < kv.rows(), "sparse_attn index %d out of %zu rows", idx[i],
                kv.rows());
  }
  const auto run = [&](size_t b, size_t e) {
    HWY_DYNAMIC_DISPATCH(FastSparseAttnHeads)(q, head_dim, &kv, sink, idx, n_idx, scale, out, b, e);
  };
  if (pool == nullptr || pool->size() <= 1 || n_heads < 2) {
    run(0, n_heads);
  } else {
    pool->parallel_for(n_heads, 1, [&](size_t b, size_t e, int) { run(b, e); });
  }
}

}  // namespace cedar::ops
#endif  // HWY_ONCE
