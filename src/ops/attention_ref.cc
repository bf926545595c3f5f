// Scalar references for attention.h, written from spec §2.6 / §4.4 and the reference kernel, plus the
// top-k helper (which has no SIMD variant).
#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"
#include "ops/attention.h"
#include "ops/dot_canonical.h"
#include "ops/exact_math.h"
#include "ops/formats.h"

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

namespace {

// The general top-k: nth_element on indices with the contract's order.
void topk_by_selection(const float* scores, size_t n, size_t k, int32_t* out_idx, int32_t* scratch) {
  for (size_t i = 0; i < n; ++i) scratch[i] = static_cast<int32_t>(i);
  // Strict weak order: NaN first, then larger score first, then lower index first.
  const auto before = [scores](int32_t a, int32_t b) {
    const float va = scores[a];
    const float vb = scores[b];
    const bool na = std::isnan(va);
    const bool nb = std::isnan(vb);
    if (na != nb) return na;
    if (!na && va != vb) return va > vb;
    return a < b;
  };
  if (k < n) std::nth_element(scratch, scratch + (k - 1), scratch + n, before);
  std::copy_n(scratch, k, out_idx);
  std::sort(out_idx, out_idx + k);
}

}  // namespace

void topk_ascending(const float* scores, size_t n, size_t k, int32_t* out_idx, int32_t* scratch) {
  CEDAR_CHECK(k <= n, "topk: k %zu > n %zu", k, n);
  if (k == 0) return;
  // Index scores are bf16 values: a radix select on their 16-bit order keys finds the k-th key T in
  // two counting passes; then one pass in index order takes every key above T and the first keys
  // equal to T (lower index wins ties), which is also the ascending output order. The same set as
  // the selection below, without indirect comparisons; any non-bf16 score takes the selection.
  // One pass computes the keys and the high-byte histogram. The key is an order-preserving 16-bit
  // image of a bf16 score: the contract's order (NaN above everything, -0 == +0) becomes unsigned
  // integer order; a score with low bits set is no bf16 value and sends the call to the selection.
  uint32_t hist[256] = {};
  uint32_t not_bf16 = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, scores + i, 4);
    const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    not_bf16 |= nan ? 0u : (u & 0xFFFFu);
    if (u == 0x80000000u) u = 0;  // -0 ranks with +0
    const uint32_t ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    const int32_t key = nan ? 0xFFFF : static_cast<int32_t>(ordered >> 16);
    scratch[i] = key;
    ++hist[key >> 8];
  }
  if (not_bf16 != 0) return topk_by_selection(scores, n, k, out_idx, scratch);
  size_t above = 0;  // keys in buckets above the current one
  int hi = 255;
  while (above + hist[hi] < k) above += hist[hi--];
  uint32_t low_hist[256] = {};
  for (size_t i = 0; i < n; ++i)
    if ((scratch[i] >> 8) == hi) ++low_hist[scratch[i] & 0xFF];
  int lo = 255;
  while (above + low_hist[lo] < k) above += low_hist[lo--];
  const int32_t threshold = (hi << 8) | lo;
  size_t equal_left = k - above;  // how many keys equal to the threshold are taken
  size_t j = 0;
  for (size_t i = 0; i < n && j < k; ++i) {
    if (scratch[i] > threshold || (scratch[i] == threshold && equal_left > 0)) {
      if (scratch[i] == threshold) --equal_left;
      out_idx[j++] = static_cast<int32_t>(i);
    }
  }
}

}  // namespace cedar::ops
