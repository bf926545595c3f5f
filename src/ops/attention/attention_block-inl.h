// Per-target (Highway) helper shared by the exact and the fast sparse attention (attention_exact.cc,
// attention_fast.cc): the scores of one block of indices. Include inside a file compiled through
// foreach_target.h, after "hwy/highway.h".
#if defined(CEDAR_OPS_ATTENTION_BLOCK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CEDAR_OPS_ATTENTION_BLOCK_INL_H_
#undef CEDAR_OPS_ATTENTION_BLOCK_INL_H_
#else
#define CEDAR_OPS_ATTENTION_BLOCK_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/highway.h"
#include "ops/attention/attention.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {

// For the block's nb indices: rows[j] = the KV row and score[j] = dot(q, row) · scale, or nullptr and
// -inf for index -1. Returns the block's largest score. The two ops differ only in `dot`.
template <typename Dot>
HWY_INLINE float SparseAttnBlockScores(const float* q, const KvRows& kv, const int32_t* idx, size_t nb,
                                       size_t head_dim, float scale, const Dot& dot, const float** rows,
                                       float* score) {
  float block_max = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < nb; ++j) {
    const int32_t r = idx[j];
    if (r < 0) {
      rows[j] = nullptr;
      score[j] = -std::numeric_limits<float>::infinity();
    } else {
      rows[j] = kv.row(static_cast<size_t>(r), head_dim);
      score[j] = dot(q, rows[j], head_dim) * scale;
    }
    block_max = std::max(block_max, score[j]);
  }
  return block_max;
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
