#include "runtime/scripted_engine.h"

#include <algorithm>
#include <array>
#include <thread>

#include "core/timer.h"

namespace cedar::runtime {

using Clock = std::chrono::steady_clock;

struct ScriptedEngine::Job {
  GenerationRequest request;
  std::shared_ptr<GenerationStream> stream;
  const ScriptedReply* reply = nullptr;
  GenerationResult result;
  Timer timer;                    // since submit()
  Clock::time_point due;          // when its next event (prefill done, next token) plays
  bool admitted = false;          // left the queue for the batch
  bool prefilled = false;
  size_t played = 0;              // reply tokens played
};

ScriptedEngine::ScriptedEngine(std::vector<ScriptedReply> replies, EngineInfo info, ScriptedEngineOptions options,
                               Detokenizer prompt_text)
    : replies_(std::move(replies)),
      info_(std::move(info)),
      options_(options),
      batch_(options.max_active > 0 ? options.max_active : options.max_batch),
      prompt_text_(std::move(prompt_text)) {
  thread_ = std::thread([this] { scheduler_loop(); });
}

ScriptedEngine::~ScriptedEngine() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

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

Result<std::shared_ptr<GenerationStream>> ScriptedEngine::submit(GenerationRequest request) {
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
  if (request.top_logprobs < 0 || request.top_logprobs > kMaxTopLogprobs)
    return invalid_argument("top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "]");
  auto job = std::make_unique<Job>();
  job->stream = std::make_shared<GenerationStream>(request.logprobs);
  job->request = std::move(request);
  std::shared_ptr<GenerationStream> stream = job->stream;
  stream->set_cancel_listener([this] {
    {
      std::lock_guard lock(mu_);
      ++events_;
    }
    cv_.notify_all();
  });
  std::vector<std::unique_ptr<Job>> dropped;  // finished outside the lock
  Status refused;
  {
    std::lock_guard lock(mu_);
    take_cancelled_waiting(&dropped);  // requests whose clients left hold no place
    if (stop_) refused = failed_precondition("the engine is shutting down");
    else if (static_cast<int>(waiting_.size()) >= options_.max_queue + std::max(0, batch_ - stats_.active_sequences))
      refused = resource_exhausted("the request queue is full (" + std::to_string(options_.max_queue) +
                                   " waiting); retry later");
    else waiting_.push_back(std::move(job));
    stats_.queue_depth = static_cast<int>(waiting_.size());
  }
  for (auto& j : dropped) finish(*j, FinishReason::kCancelled);
  if (!refused.ok()) return refused;
  cv_.notify_all();
  return stream;
}

void ScriptedEngine::take_cancelled_waiting(std::vector<std::unique_ptr<Job>>* out) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->stream->cancelled()) {
      (*it)->result.prompt_tokens = static_cast<int>((*it)->request.prompt_ids.size());
      (*it)->result.queue_seconds = (*it)->timer.seconds();
      (*it)->request.cache_prefix = false;  // it never ran
      out->push_back(std::move(*it));
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
}

void ScriptedEngine::scheduler_loop() {
  for (;;) {
    std::vector<std::unique_ptr<Job>> admitted, dropped;
    {
      std::unique_lock lock(mu_);
      Clock::time_point wake = Clock::time_point::max();
      for (const auto& j : active_) wake = std::min(wake, j->due);
      const uint64_t seen = events_;
      cv_.wait_until(lock, wake, [&] {
        return stop_ || events_ != seen || (!waiting_.empty() && stats_.active_sequences < batch_) ||
               Clock::now() >= wake;
      });
      if (stop_) break;
      take_cancelled_waiting(&dropped);
      while (!waiting_.empty() && stats_.active_sequences < batch_) {
        ++stats_.active_sequences;
        waiting_.front()->admitted = true;
        std::unique_ptr<Job> j = std::move(waiting_.front());
        waiting_.pop_front();
        j->result.queue_seconds = j->timer.seconds();
        j->result.prompt_tokens = static_cast<int>(j->request.prompt_ids.size());
        j->result.cached_tokens = lookup_prefix(j->request.prompt_ids);
        j->due = Clock::now() + options_.prefill_delay_per_token * (j->result.prompt_tokens - j->result.cached_tokens);
        admitted.push_back(std::move(j));
      }
      stats_.queue_depth = static_cast<int>(waiting_.size());
    }
    for (auto& j : dropped) finish(*j, FinishReason::kCancelled);
    for (auto& j : admitted) {
      // A prompt no reply matches fails in its stream, as an error of the real engine's forward
      // pass would (the serving tests exercise errors after a stream began with it).
      Result<const ScriptedReply*> reply = pick_reply(j->request.prompt_ids);
      if (!reply.ok()) {
        {
          std::lock_guard lock(mu_);
          --stats_.active_sequences;
        }
        j->stream->finish(reply.status());
        continue;
      }
      j->reply = *reply;
      active_.push_back(std::move(j));
    }
    const Clock::time_point now = Clock::now();
    std::erase_if(active_, [&](const auto& j) {
      if (j->stream->cancelled()) {
        finish(*j, FinishReason::kCancelled);
        return true;
      }
      return j->due <= now && !advance(*j);
    });
  }
  std::vector<std::unique_ptr<Job>> left;
  {
    std::lock_guard lock(mu_);
    for (auto& j : waiting_) left.push_back(std::move(j));
    waiting_.clear();
  }
  for (auto& j : active_) left.push_back(std::move(j));
  active_.clear();
  for (auto& j : left) j->stream->finish(failed_precondition("the engine is shutting down"));
}

bool ScriptedEngine::advance(Job& j) {
  if (!j.prefilled) {
    j.prefilled = true;
    j.result.prefill_seconds = j.timer.seconds() - j.result.queue_seconds;
    j.due = Clock::now() + options_.token_delay;
    return true;
  }
  const auto& output = j.reply->output_ids;
  if (j.played >= output.size() || static_cast<int>(j.played) >= j.request.sampling.max_tokens) {
    // A script that runs out before EOS and before max_tokens ends like a stop (nothing more to say).
    finish(j, static_cast<int>(j.played) >= j.request.sampling.max_tokens ? FinishReason::kLength
                                                                           : FinishReason::kStop);
    return false;
  }
  const int32_t id = output[j.played];
  const size_t position = j.played++;
  j.result.output_ids.push_back(id);
  std::array<int32_t, kMaxTopLogprobs> top_ids{};
  std::array<float, kMaxTopLogprobs> top_logprobs{};
  TokenLogprobsView view;
  if (j.request.logprobs) {
    const int vocab = info_.vocab_size > 0 ? info_.vocab_size : 1;
    const size_t k = std::min<size_t>(static_cast<size_t>(j.request.top_logprobs), static_cast<size_t>(vocab));
    for (size_t i = 0; i < k; ++i) {
      top_ids[i] = scripted_alternative(id, static_cast<int>(i), vocab);
      top_logprobs[i] = scripted_logprob(position) - static_cast<float>(i);
    }
    view = {id, scripted_logprob(position), {top_ids.data(), k}, {top_logprobs.data(), k}};
  }
  if (!j.stream->push(id, j.request.logprobs ? &view : nullptr)) {
    finish(j, FinishReason::kCancelled);
    return false;
  }
  const auto& stops = j.request.sampling.stop_ids;
  if (id == info_.eos_id || std::find(stops.begin(), stops.end(), id) != stops.end()) {
    finish(j, FinishReason::kStop);
    return false;
  }
  if (static_cast<int>(j.played) >= j.request.sampling.max_tokens) {
    finish(j, FinishReason::kLength);
    return false;
  }
  j.due = Clock::now() + options_.token_delay;
  return true;
}

void ScriptedEngine::finish(Job& j, FinishReason reason) {
  GenerationResult& result = j.result;
  result.finish_reason = reason;
  result.decode_seconds = j.timer.seconds() - result.queue_seconds - result.prefill_seconds;
  {
    std::lock_guard lock(mu_);
    if (j.request.cache_prefix) {
      std::vector<int32_t> sequence = j.request.prompt_ids;
      sequence.insert(sequence.end(), result.output_ids.begin(), result.output_ids.end());
      stored_.push_back(std::move(sequence));
      while (stored_.size() > options_.prefix_cache_entries) stored_.pop_front();
    }
    ++stats_.requests;
    if (j.admitted) --stats_.active_sequences;
    stats_.prompt_tokens += result.prompt_tokens;
    stats_.output_tokens += result.output_ids.size();
    stats_.cached_tokens += result.cached_tokens;
    stats_.computed_prompt_tokens += result.prompt_tokens - result.cached_tokens;
    stats_.decode_tokens += result.output_ids.size();
    stats_.prefill_seconds += result.prefill_seconds;
    stats_.decode_seconds += result.decode_seconds;
  }
  j.stream->finish(std::move(result));
}

EngineStats ScriptedEngine::stats() const {
  std::lock_guard lock(mu_);
  EngineStats s = stats_;
  uint64_t stored_tokens = 0;
  for (const auto& seq : stored_) stored_tokens += seq.size();
  s.kv_bytes_memory = stored_tokens * sizeof(int32_t);  // what this double really holds: the ids
  return s;
}

}  // namespace cedar::runtime
