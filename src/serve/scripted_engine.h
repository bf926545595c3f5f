// ScriptedEngine: a runtime::Engine that "generates" token sequences it was given, so the whole
// serving path (prompt encoding, queueing, streaming decode, the DSML / reasoning parser, every
// wire format, usage accounting) can be driven end to end with known completions before (and
// independently of) the real model. It is the test hook of `cedar serve --scripted FILE`.
//
// Behaviour that mirrors what the real engine promises in runtime/engine.h:
//   - the first reply whose `when_prompt_contains` occurs in the decoded prompt is played (an empty
//     condition matches anything); no match is an InvalidArgument error naming the prompt's tail;
//   - tokens are delivered through on_token one at a time with a configurable delay; on_token
//     returning false cancels (FinishReason::kCancelled); max_tokens cuts with kLength; a stop id
//     (the EOS id always) ends with kStop, the stop token included;
//   - an emulated prefix cache: every finished request stores prompt + output; a new prompt reports
//     the longest stored token prefix as cached_tokens (at most prompt length - 1: the last prompt
//     token is always computed), and only the uncached tokens cost prefill delay. This is what lets
//     tests check that a re-rendered conversation is token-identical to what was generated;
//   - with request.on_logprobs set, every played token reports synthetic, deterministic
//     log-probabilities (scripted_logprob / scripted_alternative below), so tests of the logprobs
//     wire formats know what to expect without a model;
//   - prompt + max_tokens over max_context, an empty prompt, or more than max_active requests at
//     once are the errors the real engine gives (InvalidArgument / ResourceExhausted).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace cedar::serve {

struct ScriptedReply {
  std::string when_prompt_contains;  // empty: matches every prompt
  std::vector<int32_t> output_ids;   // played in order (include the EOS id to end with kStop)
};

struct ScriptedEngineOptions {
  std::chrono::microseconds token_delay{0};               // per generated token
  std::chrono::microseconds prefill_delay_per_token{0};  // per prompt token not served from the cache
  int max_active = 0;                                    // concurrent generate() calls; 0 = no limit
  size_t prefix_cache_entries = 256;                     // sequences the emulated prefix cache keeps
};

// The synthetic distribution of the scripted engine: the token at output position i has
// log-probability -0.25 * (i % 4); its alternatives are the token itself first, then ids
// (token + j) % vocab_size with log-probability scripted_logprob(i) - j, for j = 1, 2, ...
// (all exact in binary floating point).
inline float scripted_logprob(size_t position) { return 0.0f - 0.25f * static_cast<float>(position % 4); }  // +0, not -0
inline int32_t scripted_alternative(int32_t token, int j, int vocab_size) {
  return static_cast<int32_t>((static_cast<int64_t>(token) + j) % vocab_size);
}

class ScriptedEngine : public runtime::Engine {
 public:
  // `prompt_text` turns prompt ids back into text for the reply conditions.
  using Detokenizer = std::function<std::string(std::span<const int32_t>)>;
  ScriptedEngine(std::vector<ScriptedReply> replies, runtime::EngineInfo info, ScriptedEngineOptions options,
                 Detokenizer prompt_text);

  Result<runtime::GenerationResult> generate(const runtime::GenerationRequest& request) override;
  runtime::EngineInfo info() const override { return info_; }
  runtime::EngineStats stats() const override;

 private:
  Result<const ScriptedReply*> pick_reply(std::span<const int32_t> prompt) const;
  // Longest stored prefix of `prompt` (capped at prompt.size() - 1); counts the hit or miss.
  int lookup_prefix(std::span<const int32_t> prompt);
  void store_prefix(std::vector<int32_t> sequence);

  const std::vector<ScriptedReply> replies_;
  const runtime::EngineInfo info_;
  const ScriptedEngineOptions options_;
  const Detokenizer prompt_text_;

  // The emulated prefix cache and the statistics; this test double's own state, locked briefly
  // (never while sleeping or calling on_token).
  mutable std::mutex mu_;
  std::deque<std::vector<int32_t>> stored_;  // most recent last
  runtime::EngineStats stats_;
};

}  // namespace cedar::serve
