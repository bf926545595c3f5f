#include "runtime/engine.h"

#include "core/check.h"

namespace cedar::runtime {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "error";
}

GenerationStream::Update GenerationStream::next(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, deadline, [&] { return finished_ || !pending_.empty(); });
  Update update;
  update.tokens.swap(pending_);
  if (pending_logprobs_.size() > 0) std::swap(update.logprobs, pending_logprobs_);
  update.finished = finished_;
  return update;
}

void GenerationStream::cancel() {
  // The listener runs under the lock, so finish() (which drops it) cannot race with a call into an
  // engine that is going away.
  std::lock_guard lock(mu_);
  if (cancelled_.exchange(true)) return;
  if (cancel_listener_) cancel_listener_();
}

bool GenerationStream::cancelled() const { return cancelled_.load(std::memory_order_acquire); }

const Result<GenerationResult>& GenerationStream::result() const {
  std::lock_guard lock(mu_);
  CEDAR_CHECK(result_.has_value(), "GenerationStream::result() before the request finished");
  return *result_;
}

bool GenerationStream::push(int32_t token, const TokenLogprobsView* logprobs) {
  bool keep;
  {
    std::lock_guard lock(mu_);
    pending_.push_back(token);
    if (logprobs && logprobs_) {
      TokenLogprobs& to = pending_logprobs_;
      to.k = static_cast<int>(logprobs->top_ids.size());
      to.logprob.push_back(logprobs->logprob);
      to.top_ids.insert(to.top_ids.end(), logprobs->top_ids.begin(), logprobs->top_ids.end());
      to.top_logprobs.insert(to.top_logprobs.end(), logprobs->top_logprobs.begin(), logprobs->top_logprobs.end());
    }
    keep = !cancelled();
  }
  cv_.notify_all();
  return keep;
}

void GenerationStream::finish(Result<GenerationResult> result) {
  {
    std::lock_guard lock(mu_);
    CEDAR_CHECK(!finished_, "GenerationStream::finish() called twice");
    result_.emplace(std::move(result));
    finished_ = true;
    cancel_listener_ = nullptr;
  }
  cv_.notify_all();
}

void GenerationStream::set_cancel_listener(std::function<void()> listener) {
  std::lock_guard lock(mu_);
  cancel_listener_ = std::move(listener);
}

Result<GenerationResult> generate(Engine& engine, GenerationRequest request,
                                  const std::function<bool(const GenerationStream::Update&)>& on_update) {
  CEDAR_ASSIGN_OR_RETURN(std::shared_ptr<GenerationStream> stream, engine.submit(std::move(request)));
  for (;;) {
    GenerationStream::Update update = stream->next();
    if (on_update && (!update.tokens.empty() || update.finished) && !on_update(update)) stream->cancel();
    if (update.finished) break;
  }
  return stream->result();
}

}  // namespace cedar::runtime
