// CED decoder narrowing (spec §8, ModelOptions::decoder_narrowing, off by default: an approximation):
// after the last KV source, prefill chunks keep only their last `tail` tokens. Support for
// Transformer (transformer.h), not a model.py class.
#pragma once

#include <cstdint>
#include <vector>

#include "model/csa2_state.h"
#include "model/forward_batch.h"

namespace cedar::model {

// Moves the kept rows of streams [T, hc, dim], pre_mix [T, hc], image_rows [T] and the Csa2State
// (the published top-k re-offset to the shorter window operand) to the front and updates the chunks;
// decode chunks are untouched. Returns the new row count.
size_t narrow_to_tail(std::vector<ChunkSpan>& chunks, size_t tail, size_t hc, size_t dim, float* streams,
                      float* pre_mix, uint8_t* image_rows, Csa2State& s);

}  // namespace cedar::model
