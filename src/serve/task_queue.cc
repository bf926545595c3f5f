#include "serve/task_queue.h"

#include <algorithm>

#include "core/check.h"

namespace cedar::serve {

GenerationTask::Update GenerationTask::wait_for_update(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return finished_ || !pending_.empty(); });
  Update update;
  update.tokens.swap(pending_);
  if (pending_logprobs_.size() > 0) {
    update.logprobs.k = pending_logprobs_.k;
    std::swap(update.logprobs, pending_logprobs_);
  }
  update.finished = finished_;
  return update;
}

const Result<runtime::GenerationResult>& GenerationTask::result() const {
  std::lock_guard lock(mu_);
  CEDAR_CHECK(result_.has_value(), "GenerationTask::result() before the task finished");
  return *result_;
}

void GenerationTask::stage_logprobs(const runtime::TokenLogprobsView& view) {
  staged_.clear();
  staged_.k = static_cast<int>(view.top_ids.size());
  staged_.logprob.push_back(view.logprob);
  staged_.top_ids.assign(view.top_ids.begin(), view.top_ids.end());
  staged_.top_logprobs.assign(view.top_logprobs.begin(), view.top_logprobs.end());
  has_staged_ = true;
}

bool GenerationTask::push_token(int32_t token) {
  {
    std::lock_guard lock(mu_);
    pending_.push_back(token);
    if (has_staged_) {
      runtime::TokenLogprobs& to = pending_logprobs_;
      to.k = staged_.k;
      to.logprob.push_back(staged_.logprob.front());
      to.top_ids.insert(to.top_ids.end(), staged_.top_ids.begin(), staged_.top_ids.end());
      to.top_logprobs.insert(to.top_logprobs.end(), staged_.top_logprobs.begin(), staged_.top_logprobs.end());
      has_staged_ = false;
    }
  }
  cv_.notify_one();
  return !cancelled();
}

void GenerationTask::finish(Result<runtime::GenerationResult> result) {
  {
    std::lock_guard lock(mu_);
    result_.emplace(std::move(result));
    finished_ = true;
  }
  cv_.notify_all();
}

void ReplayStore::remember(ReplayTurn turn) {
  if (turn.calls.empty() || capacity_ == 0) return;
  std::string key = turn.calls.front().id;
  std::lock_guard lock(mu_);
  if (turns_.insert_or_assign(key, std::move(turn)).second) order_.push_back(std::move(key));
  while (order_.size() > capacity_) {
    turns_.erase(order_.front());
    order_.pop_front();
  }
}

std::optional<ReplayTurn> ReplayStore::find(const std::string& first_call_id) const {
  std::lock_guard lock(mu_);
  auto it = turns_.find(first_call_id);
  if (it == turns_.end()) return std::nullopt;
  return it->second;
}

size_t ReplayStore::size() const {
  std::lock_guard lock(mu_);
  return turns_.size();
}

namespace {

// What a task that never reached the engine reports.
runtime::GenerationResult cancelled_before_start(const runtime::GenerationRequest& request) {
  runtime::GenerationResult r;
  r.finish_reason = runtime::FinishReason::kCancelled;
  r.prompt_tokens = static_cast<int>(request.prompt_ids.size());
  return r;
}

}  // namespace

GenerationQueue::GenerationQueue(runtime::Engine& engine, QueueLimits limits) : engine_(engine), limits_(limits) {
  CEDAR_CHECK(limits.workers > 0 && limits.max_waiting >= 0, "bad queue limits %d/%d", limits.workers,
              limits.max_waiting);
  workers_.reserve(limits.workers);
  for (int i = 0; i < limits.workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

GenerationQueue::~GenerationQueue() { shutdown(); }

Result<std::shared_ptr<GenerationTask>> GenerationQueue::submit(runtime::GenerationRequest request,
                                                                bool want_logprobs) {
  request.on_token = nullptr;  // the worker installs the task's callbacks
  request.on_logprobs = nullptr;
  auto task = std::make_shared<GenerationTask>(std::move(request), want_logprobs);
  std::vector<std::shared_ptr<GenerationTask>> dropped;  // finished outside the lock
  {
    std::lock_guard lock(mu_);
    if (stopping_) return failed_precondition("the server is shutting down");
    const size_t free_workers = limits_.workers - std::min<size_t>(active_.size(), limits_.workers);
    if (queue_.size() >= free_workers + static_cast<size_t>(limits_.max_waiting)) {
      // Tasks whose clients left while waiting still hold places; drop them before refusing.
      for (auto it = queue_.begin(); it != queue_.end();) {
        if ((*it)->cancelled()) {
          dropped.push_back(std::move(*it));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
      if (queue_.size() >= free_workers + static_cast<size_t>(limits_.max_waiting)) {
        for (auto& t : dropped) t->finish(cancelled_before_start(t->request()));
        return resource_exhausted("the request queue is full (" + std::to_string(limits_.max_waiting) +
                                  " waiting); retry later");
      }
    }
    queue_.push_back(task);
  }
  for (auto& t : dropped) t->finish(cancelled_before_start(t->request()));
  cv_.notify_one();
  return task;
}

int GenerationQueue::waiting() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(queue_.size());
}

int GenerationQueue::running() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(active_.size());
}

int GenerationQueue::retry_after_seconds() const { return 1 + waiting() / limits_.workers; }

void GenerationQueue::shutdown() {
  std::deque<std::shared_ptr<GenerationTask>> never_started;
  {
    std::lock_guard lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    never_started.swap(queue_);
    for (auto& t : active_) t->cancel();
  }
  cv_.notify_all();
  for (auto& t : never_started) {
    t->cancel();
    t->finish(cancelled_before_start(t->request()));
  }
  for (auto& w : workers_) w.join();
  workers_.clear();
}

void GenerationQueue::worker_loop() {
  for (;;) {
    std::shared_ptr<GenerationTask> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      if (!task->cancelled()) active_.push_back(task);
    }
    if (task->cancelled()) {
      task->finish(cancelled_before_start(task->request()));
      continue;
    }
    runtime::GenerationRequest request = task->request();
    GenerationTask* raw = task.get();
    request.on_token = [raw](int32_t token) { return raw->push_token(token); };
    if (task->wants_logprobs())
      request.on_logprobs = [raw](const runtime::TokenLogprobsView& view) { raw->stage_logprobs(view); };
    Result<runtime::GenerationResult> result = engine_.generate(request);
    {
      std::lock_guard lock(mu_);
      active_.erase(std::find(active_.begin(), active_.end(), task));
    }
    task->finish(std::move(result));
  }
}

}  // namespace cedar::serve
