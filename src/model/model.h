// Model: a loaded DeepSeek-V4.1 checkpoint and the forward pass of the official reference
// (inference/model.py Transformer.forward), run over a batch of sequences at different positions.
//
// Chunk semantics (docs/NUMERICS.md "Prefill, chunks and decode"):
//   * a chunk at position 0 follows the reference's prefill path (one call over the whole chunk);
//   * a chunk at position p > 0 follows the reference's decode path for each of its tokens, as if
//     they were fed one at a time: the result equals token-by-token decoding bit for bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "spec/config.h"
#include "model/dspark.h"
#include "model/engram_hash.h"
#include "spec/engram_layout.h"
#include "model/expert_exchange.h"
#include "model/image_spans.h"
#include "spec/layer_plan.h"
#include "weights/model_weights.h"
#include "weights/residency_plan.h"
#include "weights/weight_source.h"
#include "model/sequence_state.h"
#include "weights/weight_map.h"
#include "ops/kernel_set.h"
#include "ops/attention/rope.h"

namespace cedar::model {

// Which index keys a non-owning indexer scores (spec §9.1).
enum class IndexKeyMode {
  kReference,  // the official code: whatever index-key cache was published last (quirk reproduced)
  kOwner,      // the corrected behaviour: always the layer's own KV source's keys
};

// Where routed experts and Engram rows live (docs/STREAMING.md). With no budget everything is mapped
// and resident; with a budget the planner decides, and whatever does not fit streams from the SSD.
struct ResidencyOptions {
  uint64_t memory_budget = 0;    // bytes; 0 = map everything (no planning)
  uint64_t kv_reserve = 0;       // KV memory the caller keeps beside the weights
  // Overrides of the plan's cache sizes (tests, experiments): non-zero forces streaming.
  size_t expert_slots = 0, engram_slots = 0;
  std::string stats_file;        // routing statistics sidecar (warm restarts); empty = none
  bool lookahead = true;         // prefetch with the next layer's router
  bool warm_start = true;
  bool direct_io = true;
  bool io_uring = true;
};

struct ModelOptions {
  IndexKeyMode index_keys = IndexKeyMode::kReference;
  bool verify_data = false;  // read every tensor byte once at load
  // CED decoder narrowing (spec §8, off by default: an approximation): in a prefill chunk, layers
  // after the last KV source run only on the last window_size tokens.
  bool decoder_narrowing = false;
  // The kernel set (ops/kernel_set.h). The library defaults to the exact contract, which the goldens and
  // the engine's equivalence tests rely on (chunked == token by token, resume == full run); the
  // commands and the server default to fast.
  ops::Numerics numerics = ops::Numerics::kExact;
  // Window and main KV entry format (sequence_state.h). kBf16 is an experiment for `cedar eval`
  // (docs/EVAL.md); sequences made under one format cannot be run under the other.
  KvDtype kv_dtype = KvDtype::kReference;
  std::function<void(const io::CheckpointProgress&)> progress;
  ResidencyOptions residency;
  // Run the DSpark draft head when the checkpoint has its stages (docs/DSPARK.md): the stages are
  // bound and every forward keeps the target layers' hook rows. Off: the stages are only validated.
  bool dspark = true;
  // Expert parallelism (docs/DISTRIBUTED.md): when set, only the backbone's routed experts for which it
  // returns true are mapped (the others are computed by other processes through an ExpertExchange).
  std::function<bool(int layer, int expert)> expert_filter;
  // An expert worker: maps nothing but its routed experts (no dense weights, no head, no Engram, no
  // DSpark); it can only serve_experts().
  bool experts_only = false;
};

// True for a backbone routed expert's tensor name (layers.L.ffn.experts.X.*), with L and X.
bool parse_routed_expert_name(std::string_view name, int* layer, int* expert);

// Look-ahead precision counters: experts guessed for the next layer, and how many it chose.
struct LookaheadStats {
  uint64_t predicted = 0, correct = 0;
};

// One sequence's next tokens in a batch.
struct SeqChunk {
  SequenceState* seq = nullptr;
  std::span<const int32_t> tokens;
  // The sequence's image spans (image_spans.h), or null for text only. Positions are the sequence's;
  // the spans this chunk reaches must lie inside it whole or be done already when they start before it.
  SequenceImages* images = nullptr;
};

// Receives the logits of a block of consecutive rows of one chunk: logits [n, vocab_size] (fp32) of the
// chunk's tokens first .. first + n - 1 (counted from the chunk's first token). Model::forward_all_rows.
using RowLogitsSink = std::function<void(size_t first, size_t n, const float* logits)>;

// Per-layer observer for tests and the golden comparison: called after every block with the
// hyper-connection streams of each chunk's last token, [n_chunks, hc_mult, dim].
using LayerObserver = std::function<void(int layer, const float* last_token_streams, size_t n_chunks)>;

class Transformer;
class VisionTower;
class VisionAligner;
struct VisionTensorStore;

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const std::string& dir, const ModelOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return *weights_; }
  const LayerPlan& plan() const { return plan_; }
  const ModelOptions& options() const { return options_; }
  void set_index_key_mode(IndexKeyMode m);
  void set_decoder_narrowing(bool on);
  // Fast numerics also re-code the head for the fast GEMV, once (ModelWeights::head_coded; under a
  // memory budget only when the model was loaded fast, as the residency plan holds it). Not while a
  // forward pass runs: it writes the shared weights.
  void set_numerics(ops::Numerics n);
  void set_kv_dtype(KvDtype d);  // for sequences made afterwards
  const ops::KernelSet& kernels() const { return ops::kernel_set(options_.numerics); }
  void set_layer_observer(LayerObserver obs) { observer_ = std::move(obs); }

  // The byte layout of this model's KV cache with `block_tokens` tokens a block (a multiple of every
  // compress ratio), in the entry format of options().kv_dtype: what a kv::KvCache home is made with.
  Result<kv::CacheGeometry> kv_geometry(uint32_t block_tokens = kDefaultKvBlockTokens) const;
  // Identity of these weights for cache keys (kv_layout.h model_fingerprint).
  uint64_t fingerprint() const { return fingerprint_; }
  // A state for up to `capacity` positions whose global KV lives in `home` (made with kv_geometry()).
  Result<SequenceState> new_sequence(int64_t capacity, kv::KvCache& home) const;
  // The same with a KV home of its own, sized for `capacity` and three forks (tests, eval, benchmarks).
  SequenceState new_sequence(int64_t capacity) const;
  static constexpr uint32_t kDefaultKvBlockTokens = 64;
  const io::Checkpoint& checkpoint() const { return checkpoint_; }
  // Ids a sampler may emit: the Engram hash maps only the tokenizer's ids, so a checkpoint whose
  // vocab_size exceeds its tokenizer (the tiny test checkpoints) must not produce the extra ids
  // (the reference would fail on its next call). Equal to vocab_size for the released model.
  size_t sampleable_vocab() const {
    return engram_hasher_ ? std::min<size_t>(config_.vocab_size, engram_hasher_->token_map_size())
                          : static_cast<size_t>(config_.vocab_size);
  }
  const std::string& dir() const { return dir_; }
  // Whether the checkpoint has a vision tower (vision_config, vision.*, aligner.*): images can be read.
  bool has_vision() const { return config_.vision.present; }
  // Whether `images` fits a chunk of `tokens` at positions p0..: the spans it reaches are whole inside
  // it, carry the image token at every position and match their patch grids (what forward() checks;
  // an engine calls it when a request arrives, so a bad request never fails a batch).
  Status check_images(const SequenceImages& images, std::span<const int32_t> tokens, int64_t p0) const;

  // Residency: the plan in force, and the source's counters (hits, misses, bytes read).
  const ResidencyPlan& residency_plan() const { return residency_plan_; }
  bool streaming() const { return source_->streaming(); }
  ResidencyStats residency_stats() const { return source_->stats(); }
  LookaheadStats lookahead_stats() const;
  void reset_residency_stats();
  // Writes the routing statistics sidecar (streaming with a stats file only).
  Status save_residency_stats() { return source_->save_stats(); }

  // Prepares `seq` (fresh, with global KV of positions [0, restored) already copied in by a prefix
  // cache) for a bounded-replay resume: the next forward starts at `replay_from` (at most `restored`);
  // positions [replay_from, restored) rebuild only window KV and attend no window slot below
  // replay_from (spec §8). tokens: the sequence's ids, at least `restored` of them; images: its image
  // spans or null (the home holds their positions' key ids, and the Engram history skips them).
  Status prepare_resume(SequenceState& seq, std::span<const int32_t> tokens, int64_t restored,
                        int64_t replay_from, const SequenceImages* images = nullptr) const;

  // Expert parallelism: routed experts that this process does not own are sent through `exchange`
  // (not owned; it must outlive every forward pass). A failed exchange fails the forward pass and
  // every later one with its error (exchange_error()).
  void set_expert_exchange(ExpertExchange* exchange);
  const Status& exchange_error() const { return exchange_error_; }
  // A worker's loop: computes the requests the head sends until it says stop; returns the
  // exchange's error if one fails.
  Status serve_experts(ExpertExchange& exchange, ThreadPool* pool);

  // The DSpark draft head, or nullptr (no stages in the checkpoint, or ModelOptions::dspark off).
  DraftHead* draft_head() const { return draft_head_.get(); }
  // The target-layer hook rows of chunk i of the last forward / forward_all_rows call (its last
  // DsparkHook::capacity() positions); empty without a draft head.
  DsparkHidden dspark_hidden(size_t chunk) const { return dspark_hook_.hidden(chunk); }

  // Runs every chunk's tokens through the model and writes the fp32 logits of each chunk's last
  // token to logits [chunks.size(), vocab_size]. Advances each sequence's state. Errors:
  // InvalidArgument (empty chunk, token id out of range, capacity exceeded).
  Status forward(std::span<const SeqChunk> chunks, float* logits, ThreadPool* pool);

  // Like forward() for one sequence's chunk (same semantics: the prefill path at position 0, the
  // decode path after), but the head runs on every row, in blocks of rows handed to `sink` in order,
  // instead of on the last token only (what scoring text needs: `cedar eval`). In exact numerics each
  // row's logits are bit-identical to the last-token logits forward() gives when the chunk ends at that
  // row (the head is per-row); fast numerics sum a block of rows in another order than a single row
  // (the GEMM against the GEMV on the re-coded head), within the bound of ops/linear/linear_fast.h. With decoder narrowing, a prefill chunk longer than the window only has rows for its
  // last window_size tokens (the others never reach the head); `sink` sees just those.
  Status forward_all_rows(const SeqChunk& chunk, const RowLogitsSink& sink, ThreadPool* pool);

 private:
  Model() = default;
  Status plan_residency_for_load();
  Status init_residency();
  Status check_chunks(std::span<const SeqChunk> chunks) const;
  // ViT + aligner for the spans of `images` that reach [from, to) and have no embeddings yet.
  Status encode_image_spans(SequenceImages& images, int64_t from, int64_t to, ThreadPool* pool);
  Status bind_vision();
  Status forward_rounds(std::span<const SeqChunk> chunks, float* logits, const RowLogitsSink* sink, ThreadPool* pool);
  Status forward_round(std::span<const SeqChunk> chunks, float* logits, const RowLogitsSink* sink, size_t sink_base,
                       ThreadPool* pool);

  std::string dir_;
  uint64_t fingerprint_ = 0;
  kv::CacheGeometry own_geometry_;  // kv_geometry() of the homes new_sequence(capacity) makes
  ModelConfig config_;
  LayerPlan plan_;
  ModelOptions options_;
  io::Checkpoint checkpoint_;
  std::unique_ptr<WeightMap> weight_map_;
  std::unique_ptr<ModelWeights> weights_;
  std::unique_ptr<WeightSource> source_;
  ResidencyPlan residency_plan_;
  bool stream_ = false;  // experts and Engram rows come from the SSD (unmapped)
  std::unique_ptr<ops::RopeTable> rope_swa_, rope_compressed_;
  EngramLayout engram_layout_;
  std::unique_ptr<NgramHasher> engram_hasher_;
  std::unique_ptr<Transformer> transformer_;  // the forward pass (transformer.h)
  LayerObserver observer_;
  std::unique_ptr<DraftHead> draft_head_;
  DsparkHook dspark_hook_;
  ExpertExchange* exchange_ = nullptr;
  Status exchange_error_;
  // The vision path, bound on the first image (a text-only server never reads the tower's pages).
  std::unique_ptr<VisionTower> vision_;
  std::unique_ptr<VisionAligner> aligner_;
  std::unique_ptr<VisionTensorStore> image_vectors_store_;
  const uint16_t* image_start_ = nullptr;  // bf16 [dim]: merge_image_embeddings' learned delimiters
  const uint16_t* image_end_ = nullptr;
  const uint16_t* image_newline_ = nullptr;
};

}  // namespace cedar::model
