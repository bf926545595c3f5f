// model.py Engram in the forward pass: the n-gram row ids of every new token (hashed before the
// first layer, as Transformer.forward does), and before each Engram layer the table rows of its
// columns, dequantised, through wkv, as a gated update of the residual streams (engram_module.h has
// the arithmetic). Runs on the engine's pool; its scratch is grow-only, so decode does not allocate.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/engram_hash.h"
#include "model/engram_module.h"
#include "model/forward_batch.h"

namespace cedar::model {

class Engram {
 public:
  Engram(const ModelParts& m, const NgramHasher* hasher) : m_(m), hasher_(hasher) {}
  // Row ids of every chunk's new tokens (image positions take part in no n-gram: engram_mask =
  // ~image_mask); their reads start at once. Nothing without an Engram hash.
  Status hash(const std::vector<ChunkSpan>& chunks, size_t T, const uint8_t* image_rows, bool any_image);
  // streams [T, hc, dim] updated in place before block l.
  void forward(int l, const Batch& b, float* streams);

 private:
  const ModelParts& m_;
  const NgramHasher* hasher_;
  std::vector<int64_t> rows_, layer_rows_, local_;
  std::vector<uint8_t> takes_part_, codes_, scales_;
  std::vector<float> e_, kv_, act_;
  EngramGateScratch gate_;
};

}  // namespace cedar::model
