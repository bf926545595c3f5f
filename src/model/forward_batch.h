// What the layer types of the forward pass (transformer.h, block.h, attention.h, moe.h, engram.h)
// share: the parts of the loaded model they read, the batch of a call, grow-only scratch and the
// threading policy. Support, not a model.py class; not part of the model module's interface.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "spec/config.h"
#include "model/image_spans.h"
#include "spec/layer_plan.h"
#include "weights/model_weights.h"
#include "model/sequence_state.h"
#include "weights/weight_source.h"
#include "ops/kernel_set.h"
#include "ops/attention/rope.h"

namespace cedar::model {

// The least work (floats written) for which a decode step dequantises its window ring or its selected
// compressed KV entries on all threads of the pool: below it the hand-off costs more than the other
// threads save (the tiny preset's 16 x 64 windows decoded 10-20 % slower at depth 4096 when split).
inline constexpr size_t kMinParallelDequantFloats = 8192;

// Grows a scratch vector without shrinking; steady-state decode therefore never allocates.
template <typename T>
T* scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// The loaded model as the layer types read it (Model owns all of it; it outlives them).
struct ModelParts {
  const ModelConfig& c;
  const LayerPlan& plan;
  const ModelWeights& w;
  WeightSource& source;
  const ops::RopeTable& rope_swa;
  const ops::RopeTable& rope_compressed;
  // Compressed layers rotate with compress_rope_theta + YaRN, SWA-only layers with the base theta.
  const ops::RopeTable& rope(int layer) const {
    return plan.layers[layer].compress_ratio > 0 ? rope_compressed : rope_swa;
  }
};

// Where each chunk's tokens sit in the token-major batch tensors.
struct ChunkSpan {
  SequenceState* seq;
  const int32_t* tokens;
  int64_t p0;      // position of the first token
  size_t offset;   // first row in the batch
  size_t n;        // tokens
  int start_index_key_slot;  // the sequence's published index-key slot before this forward
  bool prefill;              // the reference's start_pos == 0 path (window operand = this chunk)
  SequenceImages* images = nullptr;  // the sequence's image spans (embeddings already computed), or null
};

// One forward call as every layer sees it: its chunks, its rows, its threads and kernels.
struct Batch {
  std::vector<ChunkSpan>& chunks;
  size_t T;  // rows (tokens) of every [T, ...] tensor
  ThreadPool* pool;
  const ops::KernelSet& k;     // exact or fast, as the model runs now
  const uint8_t* image_rows;   // [T] 1 at image-span rows (model.py image_mask)
  bool any_image;
};

// Threading policy of the forward pass, in one place: fn(begin, end, thread) over [0, n) on the
// pool's threads when there is a pool of more than one and `worth_it`, else inline. Every caller's
// items are independent, so the split never changes a bit.
template <typename Fn>
void parallel_if(ThreadPool* pool, bool worth_it, size_t n, size_t grain, Fn&& fn) {
  if (pool && worth_it && pool->size() > 1) pool->parallel_for(n, grain, fn);
  else fn(size_t{0}, n, 0);
}

// Scratch of one query of the indexer or of sparse attention; one set per pool thread.
struct QueryScratch {
  std::vector<float> scores, block_scores, gathered, cand_scores;
  std::vector<int32_t> window_idx, idx, topk_out, topk_scratch, cand_keys, gather_entry;
  std::vector<uint8_t> tile_mask;
};

// Runs fn(i, scratch, inner_pool) for queries i in [0, n). Queries of a prefill chunk are independent
// once the layer's shared state is prepared: they run in parallel, each thread with its own scratch,
// and the ops inside a query run inline (inner_pool null). One query alone keeps the pool for its ops.
template <typename Fn>
void for_queries(ThreadPool* pool, std::vector<QueryScratch>& per_thread, size_t n, Fn&& fn) {
  const size_t threads = pool ? static_cast<size_t>(pool->size()) : 1;
  if (per_thread.size() < threads) per_thread.resize(threads);
  if (n == 1 || threads == 1) {
    for (size_t i = 0; i < n; ++i) fn(i, per_thread[0], pool);
    return;
  }
  pool->parallel_for(n, 1, [&](size_t b, size_t e, int t) {
    for (size_t i = b; i < e; ++i) fn(i, per_thread[static_cast<size_t>(t)], nullptr);
  });
}

}  // namespace cedar::model
