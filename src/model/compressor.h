// model.py Compressor of a KV owner layer: each completed group of compress_ratio positions becomes
// one compressed latent (softmax-gated sum for ratio 2, the bf16 projection itself for ratio 1),
// which yields the owner's main KV entry and its index key (Indexer's wk on the latent). One instance
// serves every layer; its scratch is reused.
#pragma once

#include <cstdint>
#include <vector>

#include "model/forward_batch.h"
#include "model/kv_entries.h"

namespace cedar::model {

class Compressor {
 public:
  explicit Compressor(const ModelParts& m) : m_(m) {}
  // wkv(x) (and wgate(x) for ratio > 1) of every row: ratio 2 in fp32 (weights promoted), ratio 1 bf16.
  void project(int l, const Batch& b, const float* x);
  // A prefill chunk from position 0: its whole groups, then the trailing partial group into the state.
  void prefill(int l, const Batch& b, const ChunkSpan& ch, const KvEntryCodec& codec);
  // Decode position i (row `row`): into the state, and a latent when its group completes.
  void decode(int l, const Batch& b, const ChunkSpan& ch, size_t row, int64_t i, const KvEntryCodec& codec);

 private:
  void emit(int l, const Batch& b, const ChunkSpan& ch, size_t row, int64_t group, const KvEntryCodec& codec);
  void keep_in_state(const ChunkSpan& ch, int o, int slot, size_t row);

  const ModelParts& m_;
  std::vector<float> kv_, score_;  // [T, head_dim] wkv(x), wgate(x)
  std::vector<float> latent_, index_key_;
};

}  // namespace cedar::model
