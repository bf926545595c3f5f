// Engine: the interface between request handling (serve/, the CLI) and inference. One Engine owns
// the model, the KV caches and one scheduler thread; submit() may be called from many threads at
// once, returns at once with the request's GenerationStream, and the scheduler batches the running
// requests (continuous batching). Nothing here knows about HTTP or JSON.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "spec/config.h"
#include "model/image_spans.h"
#include "runtime/prefix_levels.h"

namespace cedar::runtime {

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (argmax)
  uint64_t seed = 0;         // per-request seed for the sampler's generator
  int max_tokens = 256;      // new tokens at most
  std::vector<int32_t> stop_ids;  // stop (inclusive) on any of these; the EOS id too unless ignore_eos
  bool ignore_eos = false;        // keep generating after the end-of-sequence token (benchmarks)
};

enum class FinishReason { kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

// One generated token's log-probability and its most probable alternatives, under the log-softmax
// of the model's logits over the sampleable vocabulary (ops::token_logprobs): the model's
// distribution, before temperature. The spans point into the engine's buffers and are valid only
// until the engine's next token.
struct TokenLogprobsView {
  int32_t token = 0;
  float logprob = 0;
  std::span<const int32_t> top_ids;      // most probable first (ties: lower id)
  std::span<const float> top_logprobs;   // same length as top_ids
};

// Log-probabilities of a run of generated tokens: entry i has logprob[i] of the sampled id and its
// alternatives top_ids / top_logprobs [i * k, (i + 1) * k), most probable first (ties: lower id).
struct TokenLogprobs {
  int k = 0;
  std::vector<float> logprob;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
  size_t size() const { return logprob.size(); }
  void clear() {
    logprob.clear();
    top_ids.clear();
    top_logprobs.clear();
  }
};

// The most alternatives a request may ask for (OpenAI's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;

// Constrained decoding: which tokens may come next, per request. The serve layer builds one per
// request (a grammar matcher, src/constrain) and the engine calls it in order: next_token_mask()
// for the coming token, then accept_token() with the token sampled, never both at once. The calls
// come from two threads: next_token_mask() from the engine's mask thread (runtime::MaskPrefetcher,
// while the forward pass runs), accept_token() from the scheduler thread after sampling; each call
// happens-after the previous one. An exception from next_token_mask() ends that request with an
// error. The engine knows nothing about grammars; this interface is all it sees.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The allowed tokens of the next step as a bitmask, bit (id % 32) of word id / 32 set when `id` may
  // be sampled; at least ceil(vocab_size / 32) words, owned by the constraint and valid until the
  // next call. nullptr: every token is allowed (nothing to mask, e.g. inside free reasoning).
  virtual const uint32_t* next_token_mask() = 0;
  // The token sampled; false when the constraint cannot take it (the engine ends the request with
  // an error: a masked sampler never picks such a token).
  virtual bool accept_token(int32_t token) = 0;
  // Budget-aware closing, asked before accept_token() with the token just sampled from the last
  // mask and the number of tokens the output may still hold after it. nullptr: the constraint can
  // still be completed within that budget after `token` (or nothing would help). Else a narrower
  // mask, a subset of the last one, of the tokens after which it can: the engine samples again
  // from it, so an output that max_tokens cuts still ends complete (valid JSON, closed tool calls).
  virtual const uint32_t* mask_to_finish_within(int32_t token, int tokens_left_after) {
    (void)token;
    (void)tokens_left_after;
    return nullptr;
  }
};

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  // Report every generated token's log-probability and its `top_logprobs` (0..kMaxTopLogprobs)
  // most probable alternatives in the stream's updates.
  bool logprobs = false;
  int top_logprobs = 0;
  // Store prompt + output in the prefix cache when the request ends (memory, then disk).
  bool cache_prefix = true;
  // Constrained decoding (null: none). Shared so copies of the request share the one state; only
  // the engine's thread touches it while the request runs.
  std::shared_ptr<TokenConstraint> constraint;
  // Image spans of the prompt (prompt_ids already expanded: image_token_id at every span position),
  // or null for text. Each span is prefilled in one chunk. Each span carries the SHA-256 of its
  // image's bytes (ImageSpan::content_sha256): the prefix cache keys its positions by it
  // (model::image_key_id), so the same image at the same place hits and another image never does.
  std::shared_ptr<model::SequenceImages> images;
};

struct GenerationResult {
  std::vector<int32_t> output_ids;   // generated tokens (the stop token included when it was emitted)
  FinishReason finish_reason = FinishReason::kStop;
  int prompt_tokens = 0;
  int cached_tokens = 0;             // prompt tokens whose global KV came from the prefix cache
  int replayed_tokens = 0;           // tokens recomputed to rebuild the SWA windows after a cache hit
  double queue_seconds = 0, prefill_seconds = 0, decode_seconds = 0;
  // Speculative decoding: verify passes, drafts verified, and drafts accepted (each accepted draft is
  // an output token that needed no pass of its own).
  int verify_passes = 0, drafted_tokens = 0, accepted_tokens = 0;
};

struct EngineInfo {
  std::string model_id;          // e.g. the checkpoint directory name
  int vocab_size = 0;
  int32_t bos_id = 0, eos_id = 1;
  int max_context = 0;           // longest prompt + output the engine accepts
  int max_batch = 1;             // sequences advanced together (for a refused client's Retry-After)
  // Images: the placeholder id (config.json's image_token_id) and the tower's config; vision.present
  // is false for a checkpoint without a vision tower, which cannot read images.
  int32_t image_token_id = -1;
  model::VisionConfig vision;
};

// One submitted request's output: the engine appends tokens as it samples them and finishes the
// stream once; any thread reads it. Reading never polls: next() sleeps until tokens arrive, the
// request ends, or the caller's deadline (a keep-alive timer) passes.
class GenerationStream {
 public:
  explicit GenerationStream(bool logprobs) : logprobs_(logprobs) {}
  GenerationStream(const GenerationStream&) = delete;
  GenerationStream& operator=(const GenerationStream&) = delete;

  struct Update {
    std::vector<int32_t> tokens;  // generated since the previous call, in order
    TokenLogprobs logprobs;       // entry i belongs to tokens[i]; empty unless the request asked for them
    bool finished = false;        // the request ended; result() is valid
  };
  // Takes what arrived since the last call, waiting until something did, the request ended, or
  // `deadline` passed (then the update may be empty).
  Update next(std::chrono::steady_clock::time_point deadline);
  Update next() { return next(std::chrono::steady_clock::time_point::max()); }
  // Asks the engine to end the request (client gone, stop string seen): a queued request leaves the
  // queue at once, a running one at the engine's next step, with FinishReason::kCancelled. Any
  // thread, any number of times.
  void cancel();
  bool cancelled() const;
  // The engine's answer; valid once an update said finished.
  const Result<GenerationResult>& result() const;

  // ---- Engine side.
  bool wants_logprobs() const { return logprobs_; }
  // Appends one token (with its log-probabilities when the request wants them). Returns false when
  // the stream was cancelled.
  bool push(int32_t token, const TokenLogprobsView* logprobs);
  void finish(Result<GenerationResult> result);
  // Called once by the first cancel(), on the cancelling thread with the stream's lock held, so the
  // engine can react without polling; finish() drops it. It must not call back into the stream.
  void set_cancel_listener(std::function<void()> listener);

 private:
  const bool logprobs_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> cancelled_{false};
  std::function<void()> cancel_listener_;
  std::vector<int32_t> pending_;     // tokens not yet taken by next()
  TokenLogprobs pending_logprobs_;   // theirs
  bool finished_ = false;
  std::optional<Result<GenerationResult>> result_;
};

struct EngineStats {             // cumulative, for /metrics
  uint64_t requests = 0, prompt_tokens = 0, output_tokens = 0, cached_tokens = 0;
  // Prompt tokens the model ran (uncached ones plus the replayed window), and of those the replayed.
  uint64_t computed_prompt_tokens = 0, replayed_tokens = 0;
  uint64_t decode_tokens = 0;    // tokens run by decode steps
  uint64_t prefix_hits = 0, prefix_misses = 0;
  // Wall time of the engine's forward steps, split between prefill and decode by the tokens each
  // (batched) step ran: rates from these are aggregate throughput, not per-request speeds.
  double prefill_seconds = 0, decode_seconds = 0;
  // Constrained decoding: tokens sampled under a mask; the time the constraints add to the steps
  // (waiting for masks not ready when the forward pass ends, applying them to the logits, advancing
  // the matchers: the per-token overhead); and the time spent computing the masks, which runs
  // beside the forward pass (runtime/mask_prefetcher.h).
  uint64_t constrained_tokens = 0;
  double constraint_seconds = 0;
  double constraint_mask_seconds = 0;
  // Steps a constrained sequence sat out because its mask was not ready when the step ended.
  uint64_t constraint_parked_steps = 0;
  // Tokens sampled again from a narrower mask so that the constraint completes within max_tokens
  // (TokenConstraint::mask_to_finish_within).
  uint64_t constraint_budget_resamples = 0;
  uint64_t kv_bytes_memory = 0, kv_bytes_disk = 0;  // prefix cache
  PrefixLevelStats prefix_levels;  // prefix-cache hits by level (memory, disk, shared tier)
  // Speculative decoding (runtime/speculative.h): verify passes, drafts verified, drafts accepted.
  uint64_t verify_passes = 0, drafted_tokens = 0, accepted_tokens = 0;
  uint64_t sequence_bytes = 0;   // working state reserved by running sequences
  int queue_depth = 0, active_sequences = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Queues the request and returns its stream at once. Errors: InvalidArgument (empty or too long
  // prompt, bad params), ResourceExhausted (the queue is full: retry later), FailedPrecondition
  // (the engine is shutting down).
  virtual Result<std::shared_ptr<GenerationStream>> submit(GenerationRequest request) = 0;
  virtual EngineInfo info() const = 0;
  virtual EngineStats stats() const = 0;
};

// Submits `request` and follows its stream on the calling thread to the end: `on_update` (may be
// empty) sees every update as it arrives and returns false to cancel. The blocking form the CLI
// and the tests use.
Result<GenerationResult> generate(Engine& engine, GenerationRequest request,
                                  const std::function<bool(const GenerationStream::Update&)>& on_update = {});

}  // namespace cedar::runtime
