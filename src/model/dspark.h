// DSpark: the checkpoint's own draft head (docs/DSPARK.md), the forward pass of the official
// Transformer.forward_spec (inference/model.py: DSparkBlock, DSparkAttention, DSparkMarkovHead,
// DSparkConfidenceHead), run through the model's kernel set (exact or fast numerics).
//
// The backbone's target-layer hook (DsparkHook, filled by every Model::forward) gives each position's
// mean of the hyper-connection streams at the attention input of dspark_target_layer_ids. A sequence's
// DraftState holds each stage's window ring of main KV; DraftHead::observe appends positions to it and
// DraftHead::draft runs one block of dspark_block_size drafts from the last observed position.
// The loop that verifies drafts is not here (issue 36, item 2).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "spec/config.h"
#include "weights/model_weights.h"
#include "weights/weight_map.h"
#include "ops/attention/rope.h"
#include "ops/sample/sample.h"

namespace cedar::model {

class Model;

// The hook rows of one chunk of the last forward: positions [p0, p0 + n), rows [n, n_targets * dim]
// as bf16 bits (the values are bf16: half the memory of floats), target layers in
// dspark_target_layer_ids order. Only the chunk's last
// DsparkHook::capacity() positions are kept: earlier ones can never reach a draft window.
struct DsparkHidden {
  int64_t p0 = 0;
  size_t n = 0;
  const uint16_t* rows = nullptr;
};

// Transformer.forward's third output, captured during the backbone forward. Not part of the forward's
// numerics: it reads the streams, never writes them.
class DsparkHook {
 public:
  // Enabled when the model runs a draft head; capacity = the positions a draft state can use.
  void configure(const ModelConfig& c, size_t capacity);
  bool enabled() const { return capacity_ > 0; }
  size_t capacity() const { return capacity_; }
  // -1 when `layer` is not a target layer.
  int target_index(int layer) const {
    return layer < static_cast<int>(target_of_layer_.size()) ? target_of_layer_[layer] : -1;
  }

  // Model::forward: clears the rows of n_chunks chunks; each round of forward_rounds maps its chunks to
  // the caller's (round_map[i] = the caller's chunk index of the round's chunk i).
  void begin_forward(size_t n_chunks);
  void set_round_map(const std::vector<size_t>* round_map) { round_map_ = round_map; }
  // The streams [n, hc, dim] of a round chunk's rows at positions [p0, p0 + n), before target layer
  // `target`'s block: row means (fp32 adds left to right, times 1/hc, bf16) into column block `target`.
  void capture(int target, size_t round_chunk, int64_t p0, size_t n, const float* streams);

  DsparkHidden hidden(size_t chunk) const;

 private:
  struct ChunkRows {
    int64_t p0 = 0;
    size_t n = 0;
    std::vector<uint16_t> rows;  // [capacity, n_targets * dim] bf16 bits
  };
  size_t capacity_ = 0, dim_ = 0, hc_ = 0, width_ = 0;
  std::vector<int> target_of_layer_;
  std::vector<ChunkRows> chunks_;
  size_t n_chunks_ = 0;
  const std::vector<size_t>* round_map_ = nullptr;
};

// One sequence's draft state: per stage, a ring of FP8-QDQ'd main KV rows (bf16 values, head_dim
// each) for the last `capacity` positions. capacity = window + block_size + 1, so that the positions
// of a rejected verification (up to block_size + 1) can be dropped without losing the window.
struct DraftState {
  int64_t n_positions = 0;  // positions observed: [0, n_positions)
  int64_t known_from = 0;   // the first position whose KV the rings hold (a prefill keeps only its tail)
  size_t capacity = 0;
  std::vector<std::vector<float>> rings;  // [n_stages][capacity * head_dim], position p in slot p % capacity

  // Forgets positions [n, n_positions): a rollback. Fails when that would need KV the rings no longer
  // hold (n below n_positions - (capacity - window)).
  Status truncate(int64_t n, int window);
};

// What one draft call produced.
struct DraftOutput {
  std::vector<int32_t> ids;       // [block_size]: the drafts for positions p+1 .. p+block_size
  std::vector<float> logits;      // [block_size, vocab] fp32, with the Markov bias
  std::vector<float> confidence;  // [block_size] raw scores (DSparkConfidenceHead)
};

struct DraftOptions {
  float temperature = 0;          // 0: argmax (ties to the lower id), else the reference sampler
  ops::SampleRng* rng = nullptr;  // required when temperature > 0
  size_t sample_vocab = 0;        // ids drafts may take: [0, sample_vocab); 0 = vocab_size
};

class DraftHead {
 public:
  // nullptr without DSpark stages in the config (or their tensors in the checkpoint).
  // (Model::load calls it after binding ModelWeights::dspark.)
  static Result<std::unique_ptr<DraftHead>> create(const Model& model);
  ~DraftHead();

  const ModelConfig& config() const;
  int block_size() const;
  // Positions a DraftState holds: window + block_size + 1.
  size_t state_capacity() const;

  DraftState new_state() const;
  // Appends the hook rows of positions [h.p0, h.p0 + h.n) to the rings: DSparkAttention's main KV of
  // every stage (prefill seeding and the decode path's ring write are the same per-row computation).
  // Positions must continue the state (h.p0 <= state.n_positions <= h.p0 + h.n; rows the state already
  // has are skipped); a state at 0 also takes a prefill's tail (h.p0 > 0) when the tail covers the window.
  Status observe(DraftState& state, const DsparkHidden& h, ThreadPool* pool);
  // One block from the last observed position p = n_positions - 1 (p >= 1): draft position 0 is `token`
  // (the id the backbone produced for position p + 1), the rest the noise id. The state is not changed.
  // One call at a time per DraftHead (it keeps the scratch); `out`'s vectors keep their capacity.
  Status draft(const DraftState& state, int32_t token, const DraftOptions& options, DraftOutput* out, ThreadPool* pool);

 private:
  explicit DraftHead(const Model& model);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cedar::model
