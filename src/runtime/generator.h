// Single-sequence generation over a Model, as the reference generate.py does it: one prefill call
// over the prompt (optionally in chunks), then one token per forward, stopping at EOS or a limit.
// Used by `cedar generate`; the serving engine batches many of these.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "ops/sample.h"
#include "runtime/engine.h"
#include "runtime/prefix_store.h"

namespace cedar::runtime {

struct GenerateOptions {
  int max_new_tokens = 64;
  float temperature = 0.0f;  // 0 = greedy
  uint64_t seed = 0;
  bool stop_at_eos = true;
  size_t prefill_chunk = 0;  // 0 = the whole prompt in one call (the reference's way)
  PrefixStore* prefix_store = nullptr;  // resume from / save to the prefix cache when set
  ReplayMode replay = ReplayMode::kBounded;
  // Record the log-probability of every sampled token and the top_logprobs most probable ids
  // (GenerateStats::logprobs); 0 = off. Log-softmax of the raw fp32 logits over the sampleable
  // vocabulary (ops/logprob.h), whatever the temperature.
  int top_logprobs = 0;
};

struct GenerateStats {
  int prompt_tokens = 0, new_tokens = 0;
  int64_t cached_tokens = 0;    // prompt tokens restored from the prefix cache
  int64_t replayed_tokens = 0;  // cached tokens recomputed to rebuild the windows (bounded replay)
  int64_t computed_tokens = 0;  // prompt tokens the forward pass ran (replay + new suffix)
  double prefill_seconds = 0, decode_seconds = 0;
  std::vector<float> last_logits;  // logits that produced the last sampled token (fp32, [vocab])
  std::vector<float> first_logits; // logits after the prompt (the first sampled token's)
  TokenLogprobs logprobs;          // when GenerateOptions::top_logprobs > 0 (reserved before decoding:
                                   // the decode loop does not allocate)
};

// Runs prompt + decode. on_token (may be empty) sees each new token as it is sampled; returning
// false stops generation. Returns the new tokens.
Result<std::vector<int32_t>> generate(model::Model& model, std::span<const int32_t> prompt,
                                      const GenerateOptions& options,
                                      const std::function<bool(int32_t)>& on_token, GenerateStats* stats,
                                      ThreadPool* pool);

}  // namespace cedar::runtime
