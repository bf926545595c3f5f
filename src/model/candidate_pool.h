// The layer-20 candidate pool (spec §4.4): model.py select_candidate_blocks, which builds it, and the
// top-k of a layer that consumes it, evaluated over the pool's keys only. Support for Indexer
// (indexer.h), not a model.py class.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/csa2_state.h"
#include "model/forward_batch.h"

namespace cedar::model {

// Block score = max of its scored entries (scores[0, scored) of n_keys), the block holding the newest
// visible entry pinned to +inf; the best candidate_topk_blocks reachable (> -inf) blocks get their flag
// in cand [cand_width] (one per block of candidate_block_size keys).
void select_candidate_blocks(const ModelConfig& c, const float* scores, size_t scored, size_t n_keys, int64_t visible,
                             uint8_t* cand, size_t cand_width, QueryScratch& qs);

// The reference masks every key outside the pool's blocks to -inf and takes the top-k over all keys:
// the same picks, scoring only the tiles that hold pool keys. q, w: the query's rows; out: the picked
// key indices, ascending. Returns how many were picked.
size_t consumer_topk(const ModelConfig& c, const float* q, const float* w, const KeyCache& kc, const uint8_t* cand,
                     size_t cand_width, int64_t n_keys, int64_t n_scored, QueryScratch& qs, ThreadPool* inner,
                     int32_t* out);

}  // namespace cedar::model
