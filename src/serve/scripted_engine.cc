#include "serve/scripted_engine.h"

#include <algorithm>
#include <array>
#include <thread>

#include "core/timer.h"

namespace cedar::serve {

ScriptedEngine::ScriptedEngine(std::vector<ScriptedReply> replies, runtime::EngineInfo info,
                               ScriptedEngineOptions options, Detokenizer prompt_text)
    : replies_(std::move(replies)), info_(std::move(info)), options_(options), prompt_text_(std::move(prompt_text)) {}

Result<const ScriptedReply*> ScriptedEngine::pick_reply(std::span<const int32_t> prompt) const {
  const std::string text = prompt_text_(prompt);
  for (const ScriptedReply& r : replies_)
    if (text.find(r.when_prompt_contains) != std::string::npos) return &r;
  const size_t tail = std::min<size_t>(text.size(), 120);
  return invalid_argument("scripted engine: no reply of the script matches this prompt (ending \"..." +
                          text.substr(text.size() - tail) +
                          "\"); add a reply with a matching when_prompt_contains, or one without it");
}

int ScriptedEngine::lookup_prefix(std::span<const int32_t> prompt) {
  std::lock_guard lock(mu_);
  size_t best = 0;
  for (const auto& seq : stored_) {
    const size_t n = std::min(seq.size(), prompt.size());
    const size_t common = std::mismatch(seq.begin(), seq.begin() + n, prompt.begin()).first - seq.begin();
    best = std::max(best, common);
  }
  // The last prompt token must run through the model to produce the first output's logits.
  best = std::min(best, prompt.size() - 1);
  if (best > 0) {
    ++stats_.prefix_hits;
  } else {
    ++stats_.prefix_misses;
  }
  return static_cast<int>(best);
}

void ScriptedEngine::store_prefix(std::vector<int32_t> sequence) {
  std::lock_guard lock(mu_);
  stored_.push_back(std::move(sequence));
  while (stored_.size() > options_.prefix_cache_entries) stored_.pop_front();
}

Result<runtime::GenerationResult> ScriptedEngine::generate(const runtime::GenerationRequest& request) {
  const auto& prompt = request.prompt_ids;
  if (prompt.empty()) return invalid_argument("the prompt is empty");
  if (request.sampling.max_tokens < 1)
    return invalid_argument("max_tokens must be at least 1 (got " + std::to_string(request.sampling.max_tokens) + ")");
  if (info_.max_context > 0 && static_cast<int64_t>(prompt.size()) + request.sampling.max_tokens > info_.max_context)
    return invalid_argument("prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" +
                            std::to_string(request.sampling.max_tokens) + ") exceeds the context of " +
                            std::to_string(info_.max_context) + " tokens");
  for (int32_t id : prompt)
    if (id < 0 || (info_.vocab_size > 0 && id >= info_.vocab_size))
      return invalid_argument("prompt token id " + std::to_string(id) + " is outside the vocabulary");
  if (request.top_logprobs < 0 || request.top_logprobs > runtime::kMaxTopLogprobs)
    return invalid_argument("top_logprobs must be in [0, " + std::to_string(runtime::kMaxTopLogprobs) + "]");
  CEDAR_ASSIGN_OR_RETURN(const ScriptedReply* reply, pick_reply(prompt));
  {
    std::lock_guard lock(mu_);
    if (options_.max_active > 0 && stats_.active_sequences >= options_.max_active)
      return resource_exhausted("scripted engine: " + std::to_string(options_.max_active) +
                                " sequences already active");
    ++stats_.active_sequences;
  }

  runtime::GenerationResult result;
  result.prompt_tokens = static_cast<int>(prompt.size());
  result.cached_tokens = lookup_prefix(prompt);
  Timer prefill;
  std::this_thread::sleep_for(options_.prefill_delay_per_token * (result.prompt_tokens - result.cached_tokens));
  result.prefill_seconds = prefill.seconds();

  Timer decode;
  result.finish_reason = runtime::FinishReason::kLength;
  std::array<int32_t, runtime::kMaxTopLogprobs> top_ids{};
  std::array<float, runtime::kMaxTopLogprobs> top_logprobs{};
  const int vocab = info_.vocab_size > 0 ? info_.vocab_size : 1;
  for (int32_t id : reply->output_ids) {
    if (static_cast<int>(result.output_ids.size()) >= request.sampling.max_tokens) break;
    std::this_thread::sleep_for(options_.token_delay);
    const size_t position = result.output_ids.size();
    result.output_ids.push_back(id);
    if (request.on_logprobs) {
      const size_t k = std::min<size_t>(static_cast<size_t>(request.top_logprobs), static_cast<size_t>(vocab));
      for (size_t j = 0; j < k; ++j) {
        top_ids[j] = scripted_alternative(id, static_cast<int>(j), vocab);
        top_logprobs[j] = scripted_logprob(position) - static_cast<float>(j);
      }
      request.on_logprobs({id, scripted_logprob(position), {top_ids.data(), k}, {top_logprobs.data(), k}});
    }
    if (request.on_token && !request.on_token(id)) {
      result.finish_reason = runtime::FinishReason::kCancelled;
      break;
    }
    const auto& stops = request.sampling.stop_ids;
    if (id == info_.eos_id || std::find(stops.begin(), stops.end(), id) != stops.end()) {
      result.finish_reason = runtime::FinishReason::kStop;
      break;
    }
  }
  // A script that runs out before EOS and before max_tokens ends like a stop (nothing more to say).
  if (result.finish_reason == runtime::FinishReason::kLength &&
      static_cast<int>(result.output_ids.size()) < request.sampling.max_tokens)
    result.finish_reason = runtime::FinishReason::kStop;
  result.decode_seconds = decode.seconds();

  if (request.cache_prefix) {
    std::vector<int32_t> sequence = prompt;
    sequence.insert(sequence.end(), result.output_ids.begin(), result.output_ids.end());
    store_prefix(std::move(sequence));
  }
  {
    std::lock_guard lock(mu_);
    --stats_.active_sequences;
    ++stats_.requests;
    stats_.prompt_tokens += result.prompt_tokens;
    stats_.output_tokens += result.output_ids.size();
    stats_.cached_tokens += result.cached_tokens;
    stats_.computed_prompt_tokens += result.prompt_tokens - result.cached_tokens;
    stats_.decode_tokens += result.output_ids.size();
    stats_.prefill_seconds += result.prefill_seconds;
    stats_.decode_seconds += result.decode_seconds;
  }
  return result;
}

runtime::EngineStats ScriptedEngine::stats() const {
  std::lock_guard lock(mu_);
  runtime::EngineStats s = stats_;
  uint64_t stored_tokens = 0;
  for (const auto& seq : stored_) stored_tokens += seq.size();
  s.kv_bytes_memory = stored_tokens * sizeof(int32_t);  // what this double really holds: the ids
  return s;
}

}  // namespace cedar::serve
