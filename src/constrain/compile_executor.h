// Grammar compilation off the request path: a few dedicated threads, each with its own xgrammar
// GrammarCompiler (xgrammar's cache off: CompiledGrammarCache holds the results), fed from a
// bounded queue. No lock that other requests wait on is held during a compilation.
//
// - Singleflight: concurrent requests for the same key share one compilation.
// - Deadline: a compilation has `timeout` from the moment it is queued. Its requesters stop waiting
//   then (InvalidArgument naming the limit); one still queued then is dropped unstarted and its
//   requesters get ResourceExhausted (the compilers were busy: not the request's fault). xgrammar cannot
//   be interrupted mid-compilation, so a running one finishes on its thread (its result still goes to
//   the cache); while it does, a replacement thread takes its place so the others are not held up, up
//   to `max_overdue` such threads. Requests for that key meanwhile fail at once.
// - Cancellation: a requester whose `cancelled()` turns true (the client left) stops waiting; a
//   compilation nobody waits for any more is dropped unless it has started.
// - Bounded: at most `max_queued` compilations wait for a thread and `max_waiters` requests wait in
//   all; beyond that ResourceExhausted (the server answers 503), so request threads stay free for
//   everyone else (/health included).
// - Contained: any exception of a compilation (std::bad_alloc, std::length_error, xgrammar's errors)
//   fails that compilation's requests only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace xgrammar {
class CompiledGrammar;
class GrammarCompiler;
class TokenizerInfo;
}  // namespace xgrammar

namespace cedar::constrain {

struct CompileOptions {
  int threads = 2;                // compilations that run at once
  int threads_per_compiler = 1;   // xgrammar's own threads inside one compilation
  double timeout_seconds = 10;    // --grammar-compile-timeout
  int max_queued = 64;            // compilations waiting for a thread
  int max_waiters = 32;           // requests waiting for compilations, all keys together
  int max_overdue = 4;            // overdue compilations given a replacement thread
};

class CompileExecutor {
 public:
  using Grammar = std::shared_ptr<const xgrammar::CompiledGrammar>;
  // Runs on a compile thread with that thread's compiler. May throw.
  using Job = std::function<Result<Grammar>(xgrammar::GrammarCompiler&)>;

  CompileExecutor(const xgrammar::TokenizerInfo& info, CompileOptions options);
  ~CompileExecutor();
  CompileExecutor(const CompileExecutor&) = delete;
  CompileExecutor& operator=(const CompileExecutor&) = delete;

  // The result of `job`, compiled under `key` (or joined to the compilation of `key` already under
  // way). Blocks the calling thread until it is done, its deadline passes, or `cancelled` (polled;
  // may be empty) returns true.
  Result<Grammar> run(const std::string& key, const Job& job, const std::function<bool()>& cancelled);

  struct Stats {
    uint64_t compiled = 0;      // compilations that ran to the end (ok or not)
    uint64_t joined = 0;        // requests that shared a compilation already queued or running
    uint64_t timed_out = 0;     // requests that gave up at the deadline
    uint64_t dropped = 0;       // compilations dropped unstarted (deadline passed, or nobody waits)
    int queued = 0, running = 0, overdue = 0, threads = 0, waiters = 0;
  };
  Stats stats() const;
  const CompileOptions& options() const { return options_; }

 private:
  struct Flight;
  void spawn_locked();
  void worker(int id);
  void leave_locked(const std::shared_ptr<Flight>& flight);

  std::unique_ptr<xgrammar::TokenizerInfo> info_;
  const CompileOptions options_;
  const std::chrono::steady_clock::duration timeout_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::shared_ptr<Flight>> queue_;
  std::unordered_map<std::string, std::shared_ptr<Flight>> in_flight_;  // queued or running, by key
  std::map<int, std::thread> threads_;
  std::vector<int> exited_;  // threads that left the pool (joined at the next spawn)
  int live_ = 0, next_id_ = 0, waiters_ = 0;
  Stats stats_;
  bool stop_ = false;
};

}  // namespace cedar::constrain
