// ScriptedEngine: a runtime::Engine that "generates" token sequences it was given, so the whole
// serving path (prompt encoding, queueing, streaming decode, the DSML / reasoning parser, every
// wire format, usage accounting) can be driven end to end with known completions before (and
// independently of) the real model. It is the test hook of `cedar serve --scripted FILE`.
//
// Like LocalEngine it runs one scheduler thread over a bounded queue (max_batch running, max_queue
// waiting, ResourceExhausted beyond), and its streams behave the same. Behaviour that mirrors what
// the real engine promises in runtime/engine.h:
//   - the first reply whose `when_prompt_contains` occurs in the decoded prompt is played (an empty
//     condition matches anything); no match is an InvalidArgument error naming the prompt's tail;
//   - tokens are delivered one at a time with a configurable delay; cancelling the stream ends
//     with FinishReason::kCancelled; max_tokens cuts with kLength; a stop id (the EOS id always)
//     ends with kStop, the stop token included;
//   - an emulated prefix cache: every finished request stores prompt + output; a new prompt reports
//     the longest stored token prefix as cached_tokens (at most prompt length - 1: the last prompt
//     token is always computed), and only the uncached tokens cost prefill delay. This is what lets
//     tests check that a re-rendered conversation is token-identical to what was generated;
//   - with request.logprobs set, every played token reports synthetic, deterministic
//     log-probabilities (scripted_logprob / scripted_alternative below), so tests of the logprobs
//     wire formats know what to expect without a model;
//   - prompt + max_tokens over max_context, an empty prompt, or a full queue are the errors the
//     real engine gives (InvalidArgument / ResourceExhausted).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"

namespace cedar::runtime {

struct ScriptedReply {
  std::string when_prompt_contains;  // empty: matches every prompt
  std::vector<int32_t> output_ids;   // played in order (include the EOS id to end with kStop)
};

struct ScriptedEngineOptions {
  std::chrono::microseconds token_delay{0};               // per generated token
  std::chrono::microseconds prefill_delay_per_token{0};  // per prompt token not served from the cache
  int max_active = 0;                                    // the script's cap on running requests (0: max_batch)
  int max_batch = 16;                                    // requests played at once
  int max_queue = 64;                                    // requests waiting beyond them
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

class ScriptedEngine : public Engine {
 public:
  // `prompt_text` turns prompt ids back into text for the reply conditions.
  using Detokenizer = std::function<std::string(std::span<const int32_t>)>;
  ScriptedEngine(std::vector<ScriptedReply> replies, EngineInfo info, ScriptedEngineOptions options,
                 Detokenizer prompt_text);
  ~ScriptedEngine() override;

  Result<std::shared_ptr<GenerationStream>> submit(GenerationRequest request) override;
  EngineInfo info() const override { return info_; }
  EngineStats stats() const override;

 private:
  struct Job;
  Result<const ScriptedReply*> pick_reply(std::span<const int32_t> prompt) const;
  // Longest stored prefix of `prompt` (capped at prompt.size() - 1); counts the hit or miss. Under mu_.
  int lookup_prefix(std::span<const int32_t> prompt);
  // Under mu_: moves the waiting jobs whose clients cancelled into `out`.
  void take_cancelled_waiting(std::vector<std::unique_ptr<Job>>* out);
  void scheduler_loop();
  // Plays the next event of a job whose time has come; false when it finished.
  bool advance(Job& job);
  void finish(Job& job, FinishReason reason);

  const std::vector<ScriptedReply> replies_;
  const EngineInfo info_;
  const ScriptedEngineOptions options_;
  const int batch_;  // requests played at once
  const Detokenizer prompt_text_;

  // The queue, the emulated prefix cache and the statistics; locked briefly, never while a
  // stream's lock is held by this thread.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> waiting_;
  std::deque<std::vector<int32_t>> stored_;  // most recent last
  EngineStats stats_;
  bool stop_ = false;
  uint64_t events_ = 0;  // cancellations, under mu_
  std::vector<std::unique_ptr<Job>> active_;  // scheduler thread only
  std::thread thread_;
};

}  // namespace cedar::runtime
