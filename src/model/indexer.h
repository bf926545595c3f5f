// model.py Indexer of a CSA2 layer: per-head weighted scores of the query against the shared index
// keys, the causal mask, the layer-20 candidate pool (select_candidate_blocks: build or consume), and
// the top-k the layer publishes in the Csa2State for itself and the layers that reuse it. One
// instance serves every layer; its scratch is reused.
#pragma once

#include <cstdint>
#include <vector>

#include "model/csa2_state.h"
#include "model/forward_batch.h"

namespace cedar::model {

enum class IndexKeyMode;

class Indexer {
 public:
  explicit Indexer(const ModelParts& m) : m_(m) {}
  // Which owner's keys a query scores, resolved once per mode (spec §9.1).
  void set_key_mode(IndexKeyMode mode);
  // [T, index_heads, index_head_dim]: Attention fills it with wq_b(qr) in the batch of its own wq_b.
  float* query_rows(size_t T) { return scratch(q_, T * m_.c.index_n_heads * m_.c.index_head_dim); }
  // The queries' RoPE and FP4 QDQ, and the per-head weights of x.
  void prepare_queries(int l, const Batch& b, const float* x);
  // Every query of a chunk: a prefill chunk's rows in parallel, or decode position i at row `row`.
  void prefill(int l, const Batch& b, Csa2State& s, const ChunkSpan& ch);
  void decode(int l, const Batch& b, Csa2State& s, const ChunkSpan& ch, size_t row, int64_t i);

 private:
  const KeyCache& keys(int l, Csa2State& s, const ChunkSpan& ch, int64_t query_pos, int64_t n_keys);
  void query(int l, const Batch& b, Csa2State& s, const ChunkSpan& ch, size_t row, int64_t query_pos,
             int64_t n_keys, int64_t visible, int32_t offset, QueryScratch& qs, ThreadPool* inner);

  using KeySource = int (*)(const LayerPlan& plan, const ChunkSpan& ch, int l, int64_t query_pos);
  const ModelParts& m_;
  KeySource key_source_ = nullptr;
  std::vector<float> q_, w_;  // [T, index_heads, index_head_dim], [T, index_heads]
  std::vector<QueryScratch> per_thread_;
};

}  // namespace cedar::model
