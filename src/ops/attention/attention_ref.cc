// Scalar references for attention.h, written from spec §2.6 / §4.4 and the reference kernel, plus the
// top-k helper (which has no SIMD variant).
#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "ops/attention/attention.h"
#include "ops/simd/dot_canonical.h"
#include "ops/simd/exact_math.h"
#include "ops/formats/formats.h"

namespace cedar::ops {

namespace ref {

void sparse_attn(const float* q, size_t n_heads, size_t head_dim, const KvRows& kv, const float* sink,
                 const int32_t* idx, size_t n_idx, float scale, float* out) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> acc(head_dim);        // [head_dim] running numerator (fp32)
  std::vector<double> block_pv(head_dim);  // [head_dim] this block's exact Σ_j bf16(p_j) v_j
  for (size_t h = 0; h < n_heads; ++h) {
    const float* qh = q + h * head_dim;
    std::fill(acc.begin(), acc.end(), 0.0f);
    float running_max = kSparseAttnMaxInit;
    float den = 0.0f;
    for (size_t start = 0; start < n_idx; start += kSparseAttnBlock) {
      const size_t nb = std::min(kSparseAttnBlock, n_idx - start);
      float score[kSparseAttnBlock];
      float block_max = neg_inf;
      for (size_t j = 0; j < nb; ++j) {
        const int32_t r = idx[start + j];
        if (r < 0) {
          score[j] = neg_inf;
        } else {
          CEDAR_CHECK(static_cast<size_t>(r) < kv.rows(), "sparse_attn index %d out of %zu rows", r,
                      kv.rows());
          score[j] = dot_canonical(qh, kv.row(static_cast<size_t>(r), head_dim), head_dim) * scale;
        }
        block_max = std::max(block_max, score[j]);
      }
      const float new_max = std::max(running_max, block_max);
      const float alpha = exp_f32(running_max - new_max);
      double p_sum = 0.0;  // Σ_j p_j of the block, float64, rounded once below
      std::fill(block_pv.begin(), block_pv.end(), 0.0);
      for (size_t j = 0; j < nb; ++j) {
        const float p = exp_f32(score[j] - new_max);
        p_sum += p;
        if (idx[start + j] < 0) continue;  // zero row: adds nothing
        const double pb = round_bf16(p);   // probabilities enter PV as bf16
        const float* v = kv.row(static_cast<size_t>(idx[start + j]), head_dim);
        for (size_t d = 0; d < head_dim; ++d) block_pv[d] += pb * v[d];
      }
      den = den * alpha + static_cast<float>(p_sum);
      for (size_t d = 0; d < head_dim; ++d) acc[d] = acc[d] * alpha + static_cast<float>(block_pv[d]);
      running_max = new_max;
    }
    den += exp_f32(sink[h] - running_max);
    float* oh = out + h * head_dim;
    for (size_t d = 0; d < head_dim; ++d) oh[d] = round_bf16(acc[d] / den);
  }
}

void indexer_scores(const float* q, const float* w, size_t n_heads, size_t head_dim, const float* keys,
                    size_t n_keys, float* scores) {
  for (size_t t = 0; t < n_keys; ++t) {
    double sum = 0.0;  // the head sum, float64, rounded once
    for (size_t h = 0; h < n_heads; ++h) {
      const float d = round_bf16(dot_canonical(q + h * head_dim, keys + t * head_dim, head_dim));
      const float relu = d > 0.0f ? d : 0.0f;
      sum += round_bf16(relu * w[h]);
    }
    scores[t] = round_bf16(static_cast<float>(sum));
  }
}

}  // namespace ref

}  // namespace cedar::ops
