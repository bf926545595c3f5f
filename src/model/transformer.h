// model.py Transformer.forward for one batch of chunks: embed (with image spans merged in) into
// hc_mult streams, Engram and Block per layer, then the head on each chunk's last row or on every
// row. Owns the streams and the Csa2State the layers hand on; the mode choices (index keys, KV
// format, decoder narrowing, look-ahead, expert exchange) are resolved here when the model is built
// or a setter changes them, not branched on inside the layers.
#pragma once

#include <cstdint>
#include <vector>

#include "model/block.h"
#include "model/csa2_state.h"
#include "model/engram.h"
#include "model/forward_batch.h"
#include "model/model.h"

namespace cedar::model {

class Transformer {
 public:
  Transformer(const ModelParts& m, const ModelOptions& o, const NgramHasher* hasher, bool lookahead);
  void set_index_key_mode(IndexKeyMode mode) { block_.attn().set_index_key_mode(mode); }
  void set_kv_dtype(KvDtype d) { block_.attn().set_kv_dtype(d); }
  // CED decoder narrowing after the last KV source (spec §8), or never (-1).
  void set_decoder_narrowing(bool on);
  void set_expert_exchange(ExpertExchange* exchange, Status* error) { block_.ffn().set_expert_exchange(exchange, error); }
  ExpertLookahead& lookahead() { return block_.ffn().lookahead(); }

  // A round's image mask and Engram row ids (their reads start now), before its KV grows.
  Status prepare(const std::vector<ChunkSpan>& chunks, size_t T);
  // logits: each chunk's last row; with a sink (one chunk), every row to the sink instead.
  void forward(std::vector<ChunkSpan>& chunks, size_t T, ThreadPool* pool, const ops::KernelSet& k,
               DsparkHook& dspark, const LayerObserver& observer, float* logits, const RowLogitsSink* sink,
               size_t sink_base);
  // An expert worker's step (MoE::serve_batch).
  void serve_batch(const ExpertBatch& batch, const ops::KernelSet& k, ThreadPool* pool, std::vector<float>& out) {
    block_.ffn().serve_batch(batch, k, pool, out);
  }

 private:
  void embed(const Batch& b);
  void head(const Batch& b, float* logits);
  void head_all_rows(const Batch& b, const RowLogitsSink& sink, size_t first_row);

  ModelParts m_;  // the layers below keep a reference to it
  Block block_;
  Engram engram_;
  Csa2State csa2_;
  int narrow_after_ = -1;  // the layer after which prefill chunks keep only their tail
  std::vector<float> streams_, pre_mix_, x_, row_logits_, observed_;
  std::vector<uint8_t> image_rows_;  // [T] 1 where the row is an image-span position (image_mask)
  bool any_image_ = false;
};

}  // namespace cedar::model
