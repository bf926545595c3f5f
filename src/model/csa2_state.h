// What CSA2 layers hand to later layers within one forward pass (spec §4.4): the top-k an indexer
// publishes for the layers that reuse it (model.py Attention's shared topk_idxs), the candidate pool
// of select_candidate_blocks, and the dequantised index keys of the shared index_k cache. One small
// named type, passed explicitly from layer to layer. Support, not a model.py class.
#pragma once

#include <cstdint>
#include <vector>

#include "model/forward_batch.h"
#include "ops/attention/index_key_store.h"

namespace cedar::model {

// Dequantised index keys of one (sequence, owner layer), kept across passes (index_keys()).
struct KeyCache {
  const SequenceState* seq = nullptr;
  int owner = -1;
  ops::IndexKeyStore keys;      // the keys in the forms the indexer kernel reads (its own layout)
  std::vector<uint8_t> packed;  // [keys.size(), index entry bytes] what the keys were decoded from
  uint64_t pass = 0;            // the forward pass that last validated or extended it
};

struct Csa2State {
  // Published top-k, [T, topk_width] rows of [count, entries...], of indexer layer topk_layer.
  std::vector<int32_t> topk;
  size_t topk_width = 0;
  int topk_layer = -1;
  // The candidate pool: one flag per block of candidate_block_size entries, [T, candidate_width].
  std::vector<uint8_t> candidates;
  size_t candidate_width = 0;

  // A new forward pass over `chunks` (T rows): nothing published yet, the pool sized for the
  // longest sequence (a row never has more entries than its sequence has positions).
  void begin_pass(const std::vector<ChunkSpan>& chunks, size_t T, const ModelConfig& c);
  // The first query of indexer layer l in this pass: every row's published list emptied.
  void begin_topk(int l, size_t T, size_t index_topk);
  int32_t* topk_row(size_t row) { return topk.data() + row * topk_width; }
  uint8_t* candidate_row(size_t row) { return candidates.data() + row * candidate_width; }
  // Decoder narrowing: row `from`'s published list and pool move to row `to`.
  void move_row(size_t from, size_t to);
  // The index keys of `owner_layer` for ch's sequence, dequantised up to n_keys (checked on first use
  // in a pass, read-only afterwards).
  const KeyCache& index_keys(const ChunkSpan& ch, int owner_layer, int64_t n_keys, size_t index_head_dim);

 private:
  std::vector<KeyCache> key_caches_;
  uint64_t pass_ = 0;  // forward passes run, so caches know whether they were checked in this one
};

// The reference's published index-key owner as token i's forward reaches layer l, when tokens are fed
// one per forward call (decode semantics): model.py's shared index_k is whatever owner wrote last.
int reference_index_key_slot(const LayerPlan& plan, const ChunkSpan& ch, int l, int64_t i);

}  // namespace cedar::model
