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
#include "ops/attention/attention.h"
#include "ops/formats/formats.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/attention/attention_fast.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "ops/simd/bf16_round-inl.h"
#include "ops/attention/attention_block-inl.h"
#include "ops/simd/dot-inl.h"

#ifndef CEDAR_OPS_ATTENTION_FAST_GROUP
#define CEDAR_OPS_ATTENTION_FAST_GROUP
namespace cedar::ops {
inline constexpr size_t kSparseAttnHeadGroup = 8;  // heads sharing each pass over the KV rows
}  // namespace cedar::ops
#endif

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Lane g of the result (g < G, G <= lanes) holds the sum of v[g]'s lanes, for all G at once: one
// shuffle tree instead of G horizontal sums, each of which would fold one vector alone. Each level
// pairs vectors a, b into Add(ConcatEven(b, a), ConcatOdd(b, a)): a's pairwise lane sums in the lower
// half, b's in the upper, so the heads stay in order, each on half as many lanes as before; once one
// vector is left, it is paired with itself until each head has one lane. (A different fp32 summation
// order than one head's SumOfLanes: fast numerics' bound covers any order.)
// (HWY_SCALAR has one lane and no ConcatEven: there each head takes SumOfLanes.)
#if HWY_TARGET != HWY_SCALAR
template <size_t G, class D, class V = hn::Vec<D>>
HWY_INLINE V SumEachOfLanes(D df, const V* v) {
  constexpr size_t P = G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : G <= 8 ? 8 : 16;
  static_assert(G <= 16, "at most 16 vectors");
  V level[P];
  for (size_t g = 0; g < P; ++g) level[g] = g < G ? v[g] : hn::Zero(df);
  for (size_t n = P; n > 1; n /= 2) {
    for (size_t i = 0; i < n / 2; ++i)
      level[i] = hn::Add(hn::ConcatEven(df, level[2 * i + 1], level[2 * i]),
                         hn::ConcatOdd(df, level[2 * i + 1], level[2 * i]));
  }
  V x = level[0];
  for (size_t lanes_per_head = hn::Lanes(df) / P; lanes_per_head > 1; lanes_per_head /= 2)
    x = hn::Add(hn::ConcatEven(df, x, x), hn::ConcatOdd(df, x, x));
  return x;
}
#endif

// G heads of one query at a time: they share the KV rows (one KV head), so each row chunk is loaded
// once for all G score dots and once for all G P·V sums, instead of once per head (the released
// model's 640 rows of 512 floats, 1.3 MB, outgrow L2, and every head read them again from L3).
// Each head's arithmetic is what it was alone: its own scores, running maximum, p and sums, the
// rows in order for every element; a row that contributes to another head of the group but not
// to this one adds 0 · v (nothing, for finite v).
template <size_t G>
HWY_INLINE void FastSparseAttnHeadGroup(const float* q, size_t head_dim, const KvRows& kv, const float* sink,
                                        const int32_t* idx, size_t n_idx, float scale, float* out) {
  const hn::ScalableTag<float> df;
  using V = hn::Vec<decltype(df)>;
  const size_t N = hn::Lanes(df);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Scores padded to whole vectors with -inf (exp gives 0 there).
  constexpr size_t kPadded = kSparseAttnBlock + HWY_MAX_BYTES / sizeof(float);
  HWY_ALIGN float score[G][kPadded];
  HWY_ALIGN float p[G][kPadded];
  HWY_ALIGN float block_pv[G][kSparseAttnMaxHeadDim];  // per head, this block's Σ_j bf16(p_j)·v_j
  HWY_ALIGN float lane_sums[G > HWY_MAX_BYTES / sizeof(float) ? G : HWY_MAX_BYTES / sizeof(float)];
  const size_t whole_dim = head_dim - head_dim % N;
  // Two rows' accumulators, a row vector each and a query vector fit in the vector registers: 32 on
  // AVX-512, 16 on AVX2 / SSE4 (and assumed on other architectures).
  constexpr size_t kVectorRegisters = HWY_TARGET <= HWY_AVX3 ? 32 : 16;
  constexpr bool kPairRows = 2 * G + 3 <= kVectorRegisters;
  float running_max[G], den[G];
  for (size_t g = 0; g < G; ++g) {
    std::fill(out + g * head_dim, out + (g + 1) * head_dim, 0.0f);  // the numerators, until the end
    running_max[g] = kSparseAttnMaxInit;
    den[g] = 0.0f;
  }
  for (size_t start = 0; start < n_idx; start += kSparseAttnBlock) {
    const size_t nb = std::min(kSparseAttnBlock, n_idx - start);
    const size_t nb_padded = (nb + N - 1) / N * N;
    const float* rows[kSparseAttnBlock];
    float block_max[G];
    for (size_t g = 0; g < G; ++g) block_max[g] = neg_inf;
    // The block's rows (a masked one scores -inf), then their score dots, two rows at a time where the
    // registers hold both rows' G accumulators: 2·G independent FMA chains hide the FMA latency that
    // G alone (one per head, head_dim / lanes long) leave exposed. Each dot is summed in the same
    // order either way.
    size_t valid[kSparseAttnBlock];
    size_t n_valid = 0;
    for (size_t j = 0; j < nb; ++j) {
      const int32_t r = idx[start + j];
      if (r < 0) {
        rows[j] = nullptr;
        for (size_t g = 0; g < G; ++g) score[g][j] = neg_inf;
        continue;
      }
      rows[j] = kv.row(static_cast<size_t>(r), head_dim);
      valid[n_valid++] = j;
    }
    // Row j's scores from its G accumulators (lanes over the first whole_dim elements).
    const auto finish_row = [&](size_t j, const V* acc) HWY_ATTR {
#if HWY_TARGET != HWY_SCALAR
      if (G <= N) {
        hn::Store(SumEachOfLanes<G>(df, acc), df, lane_sums);
      } else
#endif
      {
        for (size_t g = 0; g < G; ++g) lane_sums[g] = hn::GetLane(hn::SumOfLanes(df, acc[g]));
      }
      for (size_t g = 0; g < G; ++g) {
        float sum = lane_sums[g];
        for (size_t e = whole_dim; e < head_dim; ++e) sum += q[g * head_dim + e] * rows[j][e];
        score[g][j] = sum * scale;
        block_max[g] = std::max(block_max[g], score[g][j]);
      }
    };
    // (Written out for one and two rows: a lambda generic over the row count compiled 3-8 % slower.)
    size_t i = 0;
    if constexpr (kPairRows) {
      for (; i + 2 <= n_valid; i += 2) {
        const float* row0 = rows[valid[i]];
        const float* row1 = rows[valid[i + 1]];
        V acc0[G], acc1[G];
        for (size_t g = 0; g < G; ++g) acc0[g] = acc1[g] = hn::Zero(df);
        for (size_t d = 0; d < whole_dim; d += N) {
          const V v0 = hn::LoadU(df, row0 + d), v1 = hn::LoadU(df, row1 + d);
          for (size_t g = 0; g < G; ++g) {
            const V qg = hn::LoadU(df, q + g * head_dim + d);
            acc0[g] = hn::MulAdd(qg, v0, acc0[g]);
            acc1[g] = hn::MulAdd(qg, v1, acc1[g]);
          }
        }
        finish_row(valid[i], acc0);
        finish_row(valid[i + 1], acc1);
      }
    }
    for (; i < n_valid; ++i) {
      const float* row = rows[valid[i]];
      V acc[G];
      for (auto& a : acc) a = hn::Zero(df);
      for (size_t d = 0; d < whole_dim; d += N) {
        const V v = hn::LoadU(df, row + d);
        for (size_t g = 0; g < G; ++g) acc[g] = hn::MulAdd(hn::LoadU(df, q + g * head_dim + d), v, acc[g]);
      }
      finish_row(valid[i], acc);
    }
    float alpha[G];
    const float* pv_rows[kSparseAttnBlock];
    float pv_weight[kSparseAttnBlock][G];
    size_t n_pv = 0;
    for (size_t g = 0; g < G; ++g) {
      std::fill(score[g] + nb, score[g] + nb_padded, neg_inf);
      const float new_max = std::max(running_max[g], block_max[g]);
      alpha[g] = std::exp(running_max[g] - new_max);
      running_max[g] = new_max;
      const V vmax = hn::Set(df, new_max);
      V p_sum = hn::Zero(df);
      for (size_t j = 0; j < nb_padded; j += N) {
        const V pj = hn::Exp(df, hn::Sub(hn::Load(df, score[g] + j), vmax));
        hn::Store(RoundBf16(df, pj), df, p[g] + j);  // P·V's weights; the denominator sums pj unrounded
        p_sum = hn::Add(p_sum, pj);
      }
      den[g] = den[g] * alpha[g] + hn::GetLane(hn::SumOfLanes(df, p_sum));
    }
    // The rows that contribute to some head of the group, with each head's weight bf16(p_j).
    for (size_t j = 0; j < nb; ++j) {
      if (rows[j] == nullptr) continue;
      bool any = false;
      for (size_t g = 0; g < G; ++g) {
        pv_weight[n_pv][g] = p[g][j];
        any |= pv_weight[n_pv][g] != 0.0f;
      }
      if (any) pv_rows[n_pv++] = rows[j];
    }
    // Σ_j bf16(p_j)·v_j: elements outside, rows inside, a chunk of every head's sum in registers.
    // Two chunks of every head's sums where the registers hold them (AVX-512), else one for 5+ heads.
    constexpr size_t kChunkVecs = G >= 5 ? (kVectorRegisters >= 32 ? 2 : 1) : (G >= 3 ? 2 : 4);
    size_t e = 0;
    for (; e + kChunkVecs * N <= whole_dim; e += kChunkVecs * N) {
      V sum[G][kChunkVecs];
      for (size_t g = 0; g < G; ++g)
        for (size_t c = 0; c < kChunkVecs; ++c) sum[g][c] = hn::Zero(df);
      for (size_t i = 0; i < n_pv; ++i) {
        V v[kChunkVecs];
        for (size_t c = 0; c < kChunkVecs; ++c) v[c] = hn::LoadU(df, pv_rows[i] + e + c * N);
        for (size_t g = 0; g < G; ++g) {
          const V w = hn::Set(df, pv_weight[i][g]);
          for (size_t c = 0; c < kChunkVecs; ++c) sum[g][c] = hn::MulAdd(w, v[c], sum[g][c]);
        }
      }
      for (size_t g = 0; g < G; ++g)
        for (size_t c = 0; c < kChunkVecs; ++c) hn::Store(sum[g][c], df, block_pv[g] + e + c * N);
    }
    for (; e < whole_dim; e += N) {
      V sum[G];
      for (auto& x : sum) x = hn::Zero(df);
      for (size_t i = 0; i < n_pv; ++i) {
        const V v = hn::LoadU(df, pv_rows[i] + e);
        for (size_t g = 0; g < G; ++g) sum[g] = hn::MulAdd(hn::Set(df, pv_weight[i][g]), v, sum[g]);
      }
      for (size_t g = 0; g < G; ++g) hn::Store(sum[g], df, block_pv[g] + e);
    }
    for (; e < head_dim; ++e) {
      for (size_t g = 0; g < G; ++g) {
        block_pv[g][e] = 0.0f;
        for (size_t i = 0; i < n_pv; ++i) block_pv[g][e] += pv_weight[i][g] * pv_rows[i][e];
      }
    }
    for (size_t g = 0; g < G; ++g) {
      float* acc = out + g * head_dim;
      const V va = hn::Set(df, alpha[g]);
      size_t d = 0;
      for (; d < whole_dim; d += N)
        hn::StoreU(hn::MulAdd(hn::LoadU(df, acc + d), va, hn::Load(df, block_pv[g] + d)), df, acc + d);
      for (; d < head_dim; ++d) acc[d] = acc[d] * alpha[g] + block_pv[g][d];
    }
  }
  for (size_t g = 0; g < G; ++g) {
    float* acc = out + g * head_dim;
    const float total = den[g] + std::exp(sink[g] - running_max[g]);
    const V vden = hn::Set(df, total);
    size_t d = 0;
    for (; d < whole_dim; d += N) hn::StoreU(RoundBf16(df, hn::Div(hn::LoadU(df, acc + d), vden)), df, acc + d);
    for (; d < head_dim; ++d) acc[d] = round_bf16(acc[d] / total);
  }
}

void FastSparseAttnHeads(const float* q, size_t head_dim, const KvRows* kv_ptr, const float* sink,
                         const int32_t* idx, size_t n_idx, float scale, float* out, size_t h_begin, size_t h_end) {
  const KvRows& kv = *kv_ptr;
  size_t h = h_begin;
  for (; h + kSparseAttnHeadGroup <= h_end; h += kSparseAttnHeadGroup) {
    FastSparseAttnHeadGroup<kSparseAttnHeadGroup>(q + h * head_dim, head_dim, kv, sink + h, idx, n_idx, scale,
                                                  out + h * head_dim);
  }
  switch (h_end - h) {
    case 7: return FastSparseAttnHeadGroup<7>(q + h * head_dim, head_dim, kv, sink + h, idx, n_idx, scale, out + h * head_dim);
    case 6: return FastSparseAttnHeadGroup<6>(q + h * head_dim, head_dim, kv, sink + h, idx, n_idx, scale, out + h * head_dim);
    case 5: return FastSparseAttnHeadGroup<5>(q + h * head_dim, head_dim, kv, sink + h, idx, n_idx, scale, out + h * head_dim);
    case 4: return FastSparseAttnHeadGroup<4>(q + h * head_dim, head_dim, kv, sink + h, idx, n_idx, scale, out + h * head_dim);
    case 3: return FastSparseAttnHeadGroup<3>(q + h * head_dim, head_dim, kv, sink + h, idx, n_idx, scale, out + h * head_dim);
    case 2: return FastSparseAttnHeadGroup<2>(q + h * head_dim, head_dim, kv, sink + h, idx, n_idx, scale, out + h * head_dim);
    case 1: return FastSparseAttnHeadGroup<1>(q + h * head_dim, head_dim, kv, sink + h, idx, n_idx, scale, out + h * head_dim);
    default: return;
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
    // Chunks of whole head groups (the last may be short).
    pool->parallel_for(n_heads, kSparseAttnHeadGroup, [&](size_t b, size_t e, int) { run(b, e); });
  }
}

}  // namespace cedar::ops
#endif  // HWY_ONCE
