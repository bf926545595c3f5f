// The server's only shared mutable state between threads lives here:
//
//   GenerationTask   one request's hand-off between the worker thread that runs Engine::generate
//                    (whose on_token callback runs on the engine's thread) and the HTTP thread that
//                    decodes, parses and writes the response. Tokens flow one way through a small
//                    locked buffer; cancellation (client gone, stop string seen) flows back as a flag
//                    that on_token returns to the engine.
//   ReplayStore      the exact text of recent assistant turns that called tools, so the next turn
//                    of the conversation re-renders them byte for byte (see chat_service.h).
//   GenerationQueue  a bounded FIFO in front of a fixed set of worker threads. `workers` is how many
//                    requests the engine sees at once (it batches them); `max_waiting` bounds what
//                    waits behind them. A full queue refuses new work at once (the server answers 429
//                    with Retry-After) instead of letting latency grow without bound.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "runtime/engine.h"
#include "serve/chat_types.h"

namespace cedar::serve {

class GenerationTask {
 public:
  explicit GenerationTask(runtime::GenerationRequest request, bool want_logprobs = false)
      : request_(std::move(request)), want_logprobs_(want_logprobs) {}
  GenerationTask(const GenerationTask&) = delete;
  GenerationTask& operator=(const GenerationTask&) = delete;

  // ---- HTTP side.
  struct Update {
    std::vector<int32_t> tokens;  // generated since the previous call, in order
    // Entry i belongs to tokens[i]; empty unless the task wants logprobs (GenerationQueue::submit).
    runtime::TokenLogprobs logprobs;
    bool finished = false;        // the engine returned; result() is valid
  };
  // Waits until tokens arrive, the task finishes or `timeout` passes (then both fields may be
  // empty/false: the caller uses the pause to probe whether its client is still there).
  Update wait_for_update(std::chrono::milliseconds timeout);
  // Asks the engine to stop at its next token (client disconnected, stop string matched). Safe to
  // call from any thread, any number of times.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  // The engine's answer; only valid once an Update said finished.
  const Result<runtime::GenerationResult>& result() const;

  // ---- Worker side (GenerationQueue).
  const runtime::GenerationRequest& request() const { return request_; }
  bool wants_logprobs() const { return want_logprobs_; }
  // Appends one generated token; returns false when the task was cancelled (the engine stops).
  bool push_token(int32_t token);
  // The log-probabilities of the token the next push_token delivers (engine thread, before it).
  void stage_logprobs(const runtime::TokenLogprobsView& view);
  void finish(Result<runtime::GenerationResult> result);

 private:
  runtime::GenerationRequest request_;
  const bool want_logprobs_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> pending_;  // tokens not yet taken by the HTTP side
  runtime::TokenLogprobs pending_logprobs_;  // theirs, when the request asked for logprobs
  // The engine thread's copy of the token being reported, moved into pending_logprobs_ by push_token
  // (so both grow together under the lock).
  runtime::TokenLogprobs staged_;
  bool has_staged_ = false;
  bool finished_ = false;
  std::optional<Result<runtime::GenerationResult>> result_;
};

// One generated assistant turn that called tools, as the model wrote it.
struct ReplayTurn {
  std::vector<ToolCall> calls;  // what the client was told (ids included)
  std::string content;
  std::string reasoning;
  std::string raw;  // the output text after </think> (thinking mode) or from the start (chat mode),
                    // up to but excluding the EOS marker: content and DSML exactly as generated
};

// Bounded (oldest evicted first), keyed by the turn's first tool call id, which cedar generates
// unique per call. In memory only: after a restart turns re-render canonically.
class ReplayStore {
 public:
  explicit ReplayStore(size_t capacity = 4096) : capacity_(capacity) {}
  void remember(ReplayTurn turn);
  std::optional<ReplayTurn> find(const std::string& first_call_id) const;
  size_t size() const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, ReplayTurn> turns_;
  std::deque<std::string> order_;  // insertion order, for eviction
};

struct QueueLimits {
  int workers = 16;      // requests handed to the engine at once
  int max_waiting = 64;  // requests queued behind them before new ones get 429
};

class GenerationQueue {
 public:
  GenerationQueue(runtime::Engine& engine, QueueLimits limits);
  ~GenerationQueue();  // shutdown()
  GenerationQueue(const GenerationQueue&) = delete;
  GenerationQueue& operator=(const GenerationQueue&) = delete;

  // Queues a request (its on_token is replaced by the task's; so is its on_logprobs when
  // `want_logprobs`, the log-probabilities then arriving in the task's updates). ResourceExhausted when max_waiting
  // requests already wait; FailedPrecondition after shutdown().
  Result<std::shared_ptr<GenerationTask>> submit(runtime::GenerationRequest request, bool want_logprobs = false);

  int waiting() const;  // queued, not yet handed to the engine
  int running() const;  // inside Engine::generate
  // Seconds a refused client should wait before retrying: one "round" of the workers per
  // `workers` queued requests, at least 1.
  int retry_after_seconds() const;
  // Cancels queued and running tasks and joins the workers. Idempotent.
  void shutdown();

 private:
  void worker_loop();

  runtime::Engine& engine_;
  const QueueLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GenerationTask>> queue_;
  std::vector<std::shared_ptr<GenerationTask>> active_;  // for shutdown() to cancel
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace cedar::serve
