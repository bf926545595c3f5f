#include "model/candidate_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "ops/attention/attention.h"

namespace cedar::model {
namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
}  // namespace

void select_candidate_blocks(const ModelConfig& c, const float* scores, size_t scored, size_t n_keys, int64_t visible,
                             uint8_t* cand, size_t cand_width, QueryScratch& qs) {
  const size_t bs = c.candidate_block_size;
  const size_t nb = (n_keys + bs - 1) / bs;
  float* bscore = scratch(qs.block_scores, nb);
  for (size_t b = 0; b < nb; ++b) {
    float mx = kNegInf;
    for (size_t t = b * bs; t < std::min(scored, (b + 1) * bs); ++t) mx = std::max(mx, scores[t]);
    bscore[b] = mx;
  }
  if (visible >= 1) bscore[(visible - 1) / bs] = kPosInf;
  const size_t kb = std::min<size_t>(c.candidate_topk_blocks, nb);
  int32_t* chosen = scratch(qs.topk_out, std::max<size_t>(kb, c.index_topk));
  int32_t* tscratch = scratch(qs.topk_scratch, std::max<size_t>(nb, n_keys));
  ops::topk_ascending(bscore, nb, kb, chosen, tscratch);
  CEDAR_CHECK(nb <= cand_width, "candidate pool of %zu blocks exceeds the sized %zu", nb, cand_width);
  std::memset(cand, 0, nb);
  for (size_t j = 0; j < kb; ++j)
    if (bscore[chosen[j]] > kNegInf) cand[chosen[j]] = 1;
}

// Only pool keys can rank above -inf. When fewer than k of them are above -inf, the rest of the k
// are -inf entries, which tie and go to the lowest indices: the lowest keys outside that set (as
// topk_ascending would pick them from the full masked row).
size_t consumer_topk(const ModelConfig& c, const float* q, const float* w, const KeyCache& kc, const uint8_t* cand,
                     size_t cand_width, int64_t n_keys, int64_t n_scored, QueryScratch& qs, ThreadPool* inner,
                     int32_t* out) {
  const size_t bs = c.candidate_block_size, tile = ops::kIndexKeyTile;
  const size_t n = static_cast<size_t>(n_keys), scored = static_cast<size_t>(n_scored);
  const size_t nb = (n + bs - 1) / bs;
  CEDAR_CHECK(nb <= cand_width, "candidate pool of %zu blocks exceeds the sized %zu", nb, cand_width);
  uint8_t* mask = scratch(qs.tile_mask, (n + tile - 1) / tile);
  std::memset(mask, 0, (n + tile - 1) / tile);
  for (size_t b = 0; b < nb; ++b) {
    if (!cand[b]) continue;
    const size_t t0 = b * bs, t1 = std::min(scored, (b + 1) * bs);
    for (size_t t = t0; t < t1; t += tile) mask[t / tile] = 1;
    if (t0 < t1) mask[(t1 - 1) / tile] = 1;
  }
  float* scores = scratch(qs.scores, n);
  kc.keys.scores(q, w, c.index_n_heads, scored, scores, inner, mask);
  // The pool's visible keys in ascending order, with their scores.
  int32_t* ck = scratch(qs.cand_keys, n);
  float* cs = scratch(qs.cand_scores, n);
  size_t m = 0, above = 0;  // pool keys; of those, above -inf (NaN ranks highest)
  for (size_t b = 0; b < nb; ++b) {
    if (!cand[b]) continue;
    for (size_t t = b * bs; t < std::min(scored, (b + 1) * bs); ++t) {
      ck[m] = static_cast<int32_t>(t);
      cs[m] = scores[t];
      above += !(scores[t] == kNegInf);
      ++m;
    }
  }
  const size_t k = std::min<size_t>(c.index_topk, n);
  int32_t* local = scratch(qs.topk_out, std::max<size_t>(k, 1));
  if (above >= k) {
    ops::topk_ascending(cs, m, k, local, scratch(qs.topk_scratch, std::max<size_t>(m, 1)));
    for (size_t j = 0; j < k; ++j) out[j] = ck[local[j]];
    return k;
  }
  // Every key above -inf, then the lowest keys whose score is -inf, merged in ascending order.
  size_t picked = 0, remaining_above = above;
  size_t a = 0;  // walks the pool keys
  for (size_t t = 0; t < n && picked < k; ++t) {
    while (a < m && static_cast<size_t>(ck[a]) < t) ++a;
    const bool is_above = a < m && static_cast<size_t>(ck[a]) == t && !(cs[a] == kNegInf);
    if (is_above) {
      out[picked++] = static_cast<int32_t>(t);
      --remaining_above;
    } else if (picked + remaining_above < k) {
      out[picked++] = static_cast<int32_t>(t);  // a -inf entry, and there is room beside the rest
    }
  }
  return picked;
}

}  // namespace cedar::model
