#include "model/indexer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "model/candidate_pool.h"
#include "model/model.h"
#include "ops/attention/attention.h"
#include "ops/formats/formats.h"
#include "ops/formats/quant.h"
#include "ops/attention/rope.h"

namespace cedar::model {

void Indexer::set_key_mode(IndexKeyMode mode) {
  if (mode == IndexKeyMode::kReference)  // the official code: whatever index_k was published last
    key_source_ = [](const LayerPlan& plan, const ChunkSpan& ch, int l, int64_t pos) {
      return ch.prefill ? ch.seq->index_key_slot : reference_index_key_slot(plan, ch, l, pos);
    };
  else  // the corrected behaviour: the layer's own KV source
    key_source_ = [](const LayerPlan& plan, const ChunkSpan&, int l, int64_t) { return plan.layers[l].index_keys_from; };
}

void Indexer::prepare_queries(int l, const Batch& b, const float* x) {
  const size_t nih = m_.c.index_n_heads, ihd = m_.c.index_head_dim;
  for (const ChunkSpan& ch : b.chunks) ops::apply_rope(m_.rope(l), q_.data() + ch.offset * nih * ihd, ch.n, nih, ihd, ch.p0);
  ops::fp4_qdq_e8m0_inplace(q_.data(), b.T * nih * ihd);
  float* iw = scratch(w_, b.T * nih);  // [T, index_heads]
  b.k.linear_bf16(x, b.T, m_.w.blocks[l].attn.idx_weights_proj, iw, ops::LinearOut::kBf16, b.pool);
  const float scale = static_cast<float>(std::pow(static_cast<double>(ihd), -0.5) *
                                         std::pow(static_cast<double>(nih), -0.5));
  for (size_t i = 0; i < b.T * nih; ++i) iw[i] = ops::round_bf16(iw[i] * scale);
}

void Indexer::prefill(int l, const Batch& b, Csa2State& s, const ChunkSpan& ch) {
  const int r = m_.plan.layers[l].compress_ratio;
  const int64_t n_keys = (ch.p0 + static_cast<int64_t>(ch.n)) / r;  // end_pos // ratio
  s.begin_topk(l, b.T, m_.c.index_topk);
  if (n_keys > 0) keys(l, s, ch, ch.p0, n_keys);  // dequantised once, before the parallel queries
  for_queries(b.pool, per_thread_, ch.n, [&](size_t i, QueryScratch& qs, ThreadPool* inner) {
    const int64_t pos = ch.p0 + static_cast<int64_t>(i);
    query(l, b, s, ch, ch.offset + i, pos, n_keys, (pos + 1) / r, static_cast<int32_t>(ch.n), qs, inner);
  });
}

void Indexer::decode(int l, const Batch& b, Csa2State& s, const ChunkSpan& ch, size_t row, int64_t i) {
  const int64_t n_keys = (i + 1) / m_.plan.layers[l].compress_ratio;
  if (per_thread_.empty()) per_thread_.resize(1);
  s.begin_topk(l, b.T, m_.c.index_topk);
  if (n_keys > 0) keys(l, s, ch, i, n_keys);
  query(l, b, s, ch, row, i, n_keys, n_keys, static_cast<int32_t>(m_.c.window_size), per_thread_[0], b.pool);
}

const KeyCache& Indexer::keys(int l, Csa2State& s, const ChunkSpan& ch, int64_t query_pos, int64_t n_keys) {
  const int keys_layer = key_source_(m_.plan, ch, l, query_pos);
  CEDAR_CHECK(keys_layer >= 0, "layer %d: no index keys were published before its indexer ran", l);
  const int64_t entries = ch.seq->owner_entries[ch.seq->owner_of_layer(keys_layer)];
  CEDAR_CHECK(entries >= n_keys, "layer %d: index-key source %d holds %lld entries, %lld needed", l, keys_layer,
              static_cast<long long>(entries), static_cast<long long>(n_keys));
  return s.index_keys(ch, keys_layer, n_keys, m_.c.index_head_dim);
}

// Indexer.forward for one query: bf16 scores against the published index keys, causal mask,
// candidate pool (build or consume), top-k re-sorted ascending, unreachable -> -1, rest + offset.
void Indexer::query(int l, const Batch& b, Csa2State& s, const ChunkSpan& ch, size_t row, int64_t query_pos,
                    int64_t n_keys, int64_t visible, int32_t offset, QueryScratch& qs, ThreadPool* inner) {
  const LayerPlanEntry& e = m_.plan.layers[l];
  const size_t nih = m_.c.index_n_heads, ihd = m_.c.index_head_dim;
  CEDAR_CHECK(s.topk_layer == l, "layer %d: begin_topk was not called", l);
  int32_t* pub = s.topk_row(row);
  if (n_keys == 0) {
    pub[0] = 0;
    return;
  }
  const KeyCache& kc = keys(l, s, ch, query_pos, n_keys);
  // Only the entries this query can see are scored (a prefill query sees a causal prefix of the
  // chunk's keys); the rest are masked as the reference's causal mask does.
  const size_t scored = static_cast<size_t>(std::clamp<int64_t>(visible, 0, n_keys));
  const float* q = q_.data() + row * nih * ihd;
  const float* w = w_.data() + row * nih;
  int32_t* out = pub + 1;
  size_t picked = std::min<size_t>(m_.c.index_topk, n_keys);
  if (e.candidate == CandidateRole::kConsumer) {
    picked = consumer_topk(m_.c, q, w, kc, s.candidate_row(row), s.candidate_width, n_keys,
                           static_cast<int64_t>(scored), qs, inner, out);
  } else {
    float* scores = scratch(qs.scores, n_keys);  // [n_keys]
    kc.keys.scores(q, w, nih, scored, scores, inner);
    // scores[scored, n_keys) stay unwritten: those entries are -inf, which the code below accounts for.
    if (e.candidate == CandidateRole::kBuildsPool)
      select_candidate_blocks(m_.c, scores, scored, static_cast<size_t>(n_keys), visible, s.candidate_row(row),
                              s.candidate_width, qs);
    // Entries past the visible prefix are -inf and have the highest indices, so whenever the prefix
    // holds k entries the top-k over it is the top-k over all (ties among -inf go to lower indices).
    // A shorter prefix is picked whole, with the lowest -inf entries after it: indices [0, k).
    if (scored >= picked) ops::topk_ascending(scores, scored, picked, out, scratch(qs.topk_scratch, std::max<size_t>(scored, 1)));
    else
      for (size_t j = 0; j < picked; ++j) out[j] = static_cast<int32_t>(j);
  }
  for (size_t j = 0; j < picked; ++j) out[j] = out[j] < visible ? out[j] + offset : -1;
  pub[0] = static_cast<int32_t>(picked);
}

}  // namespace cedar::model
