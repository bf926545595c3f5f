// model.py Attention of V4.1 (CSA2, spec §4.4): the low-rank query, the FP8 window ring, the
// Compressor of a KV owner, the Indexer, sparse attention over [window ; selected compressed entries]
// and the grouped output projection. Caches live packed in the sequence's KV home (sequence_state.h).
// One instance serves every layer (the layer's weights and plan entry are looked up by index); its
// scratch is reused, so steady-state decode does not allocate.
#pragma once

#include <cstdint>
#include <vector>

#include "model/compressor.h"
#include "model/csa2_state.h"
#include "model/forward_batch.h"
#include "model/indexer.h"
#include "model/kv_entries.h"
#include "ops/linear/linear.h"

namespace cedar::model {

class Attention {
 public:
  Attention(const ModelParts& m, KvDtype kv_dtype, IndexKeyMode index_keys);
  void set_kv_dtype(KvDtype d) { codec_ = kv_entry_codec(d); }
  void set_index_key_mode(IndexKeyMode mode) { indexer_.set_key_mode(mode); }
  // x [T, dim] (normed) -> out [T, dim]; reads and writes the layer's caches and the Csa2State.
  void forward(int l, const Batch& b, Csa2State& s, const float* x, float* out);

 private:
  void prefill(int l, const Batch& b, Csa2State& s, const ChunkSpan& ch);
  void decode(int l, const Batch& b, Csa2State& s, const ChunkSpan& ch, size_t t);
  void attend(int l, const ChunkSpan& ch, const Csa2State& s, size_t row, const float* window_rows,
              size_t n_window_rows, const int32_t* window_idx, size_t n_window_idx, const ops::KernelSet& k,
              QueryScratch& qs, ThreadPool* inner);

  const ModelParts& m_;
  Compressor compressor_;
  Indexer indexer_;
  KvEntryCodec codec_;
  std::vector<float> act_, qr_, q_, kv_, o_, o_grouped_, window_rows_;
  std::vector<ops::Fp8LinearJob> fp8_jobs_;
  std::vector<QueryScratch> per_thread_;
};

}  // namespace cedar::model
