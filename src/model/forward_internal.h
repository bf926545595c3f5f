// Internals of the forward pass shared by forward.cc, forward_attention.cc and forward_moe.cc.
// Not part of the model module's interface.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/engram_module.h"
#include "model/model.h"
#include "ops/attention/attention.h"
#include "ops/attention/index_key_store.h"
#include "ops/linear/linear.h"

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

// Scratch memory of the forward pass, kept by the Model between calls.
struct Workspace {
  std::vector<float> streams, residual, x, y, mixes, pre_mix, attn_pre, post, comb;  // block level
  std::vector<float> act_scratch;                                                     // linear_fp8/fp4
  // Attention.
  std::vector<float> qr, q, kv, o, o_grouped, c_kv, c_score, index_key, idx_q, idx_w;
  std::vector<float> window_rows, gathered_rows, scores, block_scores;
  std::vector<int32_t> idx, topk_scratch, topk_out, published_topk;  // published: [T, topk_width]
  std::vector<uint8_t> candidates;                                   // [T, candidate_width]
  size_t published_topk_width = 0, candidate_width = 0;
  int published_topk_layer = -1;
  // MoE.
  std::vector<float> row_logits;  // forward_all_rows: one block of head rows
  std::vector<float> logits, expert_w, moe_acc, expert_x, expert_g, expert_u, expert_out;
  std::vector<int32_t> expert_ids, expert_tokens, expert_slot;
  struct ActiveExpert {
    int32_t expert;
    size_t row0, rows;   // rows of the [T*K, ...] expert buffers
    size_t act_offset;   // its activation scratch in moe_act
  };
  std::vector<ActiveExpert> moe_experts;
  std::vector<float> moe_act;
  std::vector<float> moe_shared_act;  // x quantised once for the experts every token chose
  std::vector<ops::Fp4GemmJob> fp4_jobs;
  std::vector<ops::Fp8LinearJob> fp8_jobs;
  std::vector<int32_t> moe_ids;              // the active experts, ascending
  std::vector<ExpertWeights> moe_held;       // weights of the group being computed
  std::vector<float> shared_g, shared_u, shared_out;
  std::vector<float> expert_row_w;           // [T*K] routing weight of each expert row
  std::vector<size_t> moe_local;             // active experts computed here (indices into moe_experts)
  std::vector<int32_t> moe_local_ids;        // their ids
  // Expert parallelism: per rank, the request of this layer, and which active experts it computes.
  std::vector<ExpertBatch> moe_remote;
  std::vector<std::vector<size_t>> moe_remote_experts;
  std::vector<int32_t> moe_token_slot;       // [T] a token's index in the request being built (-1: none)
  std::vector<float> moe_remote_out;
  // Look-ahead: the next layer's router on this layer's input (streaming only).
  int lookahead_layer = -1;
  std::vector<float> lookahead_logits, lookahead_w;
  std::vector<int32_t> lookahead_ids, lookahead_list;
  std::vector<uint8_t> lookahead_pred;       // [n_routed_experts] guessed for lookahead_layer
  // Per-query scratch of the indexer and attention, one per pool thread: prefill runs its queries in
  // parallel, each thread on its own set.
  struct QueryScratch {
    std::vector<float> scores, block_scores, gathered, cand_scores;
    std::vector<int32_t> window_idx, idx, topk_out, topk_scratch, cand_keys, gather_entry;
    std::vector<uint8_t> tile_mask;
  };
  std::vector<QueryScratch> query_scratch;
  // Dequantised index keys per (sequence, owner), valid for one forward pass.
  struct KeyCache {
    const SequenceState* seq = nullptr;
    int owner = -1;
    ops::IndexKeyStore keys;      // the keys in the forms the indexer kernel reads (its own layout)
    std::vector<uint8_t> packed;  // [keys.size(), index entry bytes] what the keys were decoded from
    uint64_t pass = 0;            // the forward pass that last validated or extended it
  };
  std::vector<KeyCache> key_caches;
  uint64_t pass = 0;  // forward passes run, so caches know whether they were checked in this one
  // Engram.
  std::vector<int64_t> engram_rows, engram_layer_rows;
  std::vector<float> engram_e, engram_kv;
  std::vector<uint8_t> engram_codes, engram_scales;
  std::vector<int64_t> engram_local;
  EngramGateScratch engram_gate;
  std::vector<uint8_t> engram_takes_part;  // [T] 0 at image positions (the Engram mask)
  // Image spans: [T] 1 where the row is an image-span position (image_mask), any_image if one is.
  std::vector<uint8_t> image_rows;
  bool any_image = false;
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

class ForwardPass {
 public:
  ForwardPass(Model& m, std::vector<ChunkSpan>& chunks, size_t n_tokens, ThreadPool* pool);
  // logits: each chunk's last row; with a sink (one chunk), every row to the sink instead.
  void run(float* logits, const RowLogitsSink* sink = nullptr, size_t sink_base = 0);

 private:
  void embed();
  void narrow_to_tail(size_t tail);
  void engram(int layer);
  std::span<const uint8_t> engram_mask();
  void block(int layer);
  void attention(int layer, const float* x, float* out);
  void attention_chunk(int layer, const ChunkSpan& ch);
  void compress_and_index_prefill(int layer, const ChunkSpan& ch);
  void decode_token(int layer, const ChunkSpan& ch, size_t t);
  void produce_latent(int layer, const ChunkSpan& ch, size_t row, int64_t group, float* latent);
  // The indexer of one query. Before the first query of a layer: begin_indexer_layer, and the index
  // keys dequantised (dequantized_index_keys) up to the largest n_keys, so that queries can then run
  // in parallel, each with its own scratch; `inner` parallelises within the query (nullptr inside a
  // parallel region).
  void begin_indexer_layer(int layer);
  int index_keys_layer(int layer, const ChunkSpan& ch, int64_t query_pos) const;
  // The query's index keys (checked, dequantised up to n_keys on first use; read-only afterwards).
  const Workspace::KeyCache& prepare_index_keys(int layer, const ChunkSpan& ch, int64_t query_pos, int64_t n_keys);
  void run_indexer(int layer, const ChunkSpan& ch, size_t row, int64_t query_pos, int64_t n_keys,
                   int64_t visible, int32_t offset, Workspace::QueryScratch& qs, ThreadPool* inner);
  // run_indexer's scores and top-k for a layer that consumes the candidate pool.
  void consumer_topk(size_t row, const float* q, const float* w, const Workspace::KeyCache& kc, int64_t n_keys,
                     int64_t n_scored, int64_t visible, int32_t offset, int32_t* pub, Workspace::QueryScratch& qs,
                     ThreadPool* inner);
  const Workspace::KeyCache& dequantized_index_keys(const ChunkSpan& ch, int owner_layer, int64_t n_keys);
  // Runs fn(i, scratch, inner_pool) for queries i in [0, n), in parallel over the pool (prefill).
  template <typename Fn>
  void for_queries(size_t n, Fn&& fn);
  void attend(int layer, const ChunkSpan& ch, size_t row, const float* window_rows, size_t n_window_rows,
              const int32_t* window_idx, size_t n_window_idx, Workspace::QueryScratch& qs, ThreadPool* inner);
  void moe(int layer, const float* x, float* out);
  // The routed experts ws_.moe_local of layer l (entries of ws_.moe_experts) on x [n_tokens, dim]:
  // row i reads x's row tokens[i], is scaled by row_w[i] and writes ye's row i. xq: x quantised
  // whole, for experts that every token chose (nullptr: quantise each expert's rows).
  void routed_experts(int l, const float* x, size_t n_tokens, const int32_t* tokens, const float* row_w,
                      const ops::PreparedActivations* xq, float* ye);
  // Expert parallelism, head side: send the rows of the experts other ranks own (returns false when
  // nothing was sent), and copy their outputs into ye's rows.
  bool post_remote_experts(int l, const float* x, const int32_t* tokens, const float* row_w);
  void collect_remote_experts(float* ye);

 public:
  // A worker's step: the batch's experts, outputs [rows, dim] into out.
  void serve_batch(const ExpertBatch& batch, std::vector<float>& out);

 private:
  void lookahead(int layer, const float* x);
  void score_lookahead(int layer);
  static constexpr size_t kLookaheadMaxTokens = 8;
  void head(float* logits);
  void head_all_rows(const RowLogitsSink& sink, size_t sink_base);
  const ops::RopeTable& rope_for(int layer) const;
  // The reference's published index-key owner as token i's forward reaches layer l, when tokens are
  // fed one per forward call (decode semantics).
  int reference_slot(const ChunkSpan& ch, int l, int64_t i) const;

  Model& m_;
  const ModelConfig& c_;
  const LayerPlan& plan_;
  const ModelWeights& w_;
  Workspace& ws_;
  std::vector<ChunkSpan>& chunks_;
  size_t T_;
  ThreadPool* pool_;
  const ops::KernelSet& k_;  // exact or fast, chosen when the model loaded
  size_t hc_dim_;
  int64_t chunks_original_p0_ = 0;  // chunk 0's first position before decoder narrowing
};

}  // namespace cedar::model
