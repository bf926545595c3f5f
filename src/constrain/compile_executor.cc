#include "constrain/compile_executor.h"

#include <algorithm>
#include <exception>
#include <new>
#include <stdexcept>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <xgrammar/xgrammar.h>

#include "core/log.h"

namespace cedar::constrain {
namespace {

using Clock = std::chrono::steady_clock;

// The compile threads' nice value: on a machine whose cores run the model and the requests, a long
// compilation takes what they leave (its own requester waits, bounded by the deadline).
constexpr int kCompileNice = 10;

// How often a waiting requester looks at cancelled().
constexpr auto kPollInterval = std::chrono::milliseconds(50);

std::string seconds_text(double s) {
  std::string t = std::to_string(s);
  t.erase(t.find_last_not_of('0') + 1);
  if (!t.empty() && t.back() == '.') t.pop_back();
  return t;
}

}  // namespace

struct CompileExecutor::Flight {
  std::string key;
  Job job;
  Clock::time_point deadline;
  int waiters = 0;
  bool running = false, done = false, overdue = false;
  Result<Grammar> result = Status(StatusCode::kInternal, "not compiled");
};

CompileExecutor::CompileExecutor(const xgrammar::TokenizerInfo& info, CompileOptions options)
    : info_(std::make_unique<xgrammar::TokenizerInfo>(info)),
      options_(options),
      timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_seconds))) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < std::max(1, options_.threads); ++i) spawn_locked();
}

CompileExecutor::~CompileExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  done_cv_.notify_all();
  // A thread still inside an overdue compilation is waited for: it uses this executor's tokenizer.
  for (auto& [id, thread] : threads_) thread.join();
}

void CompileExecutor::spawn_locked() {
  for (int id : exited_) {
    auto it = threads_.find(id);
    if (it == threads_.end()) continue;
    it->second.join();  // already out of worker(): returns at once
    threads_.erase(it);
  }
  exited_.clear();
  const int id = next_id_++;
  ++live_;
  threads_.emplace(id, std::thread([this, id] { worker(id); }));
}

void CompileExecutor::worker(int id) {
  // Per thread on Linux (and inherited by the threads xgrammar starts from it); failing is harmless.
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kCompileNice);
  std::unique_ptr<xgrammar::GrammarCompiler> compiler;
  try {
    // cache_enabled = false: xgrammar's cache is unbounded; CompiledGrammarCache is cedar's.
    compiler = std::make_unique<xgrammar::GrammarCompiler>(*info_, std::max(1, options_.threads_per_compiler),
                                                           /*cache_enabled=*/false);
  } catch (const std::exception& e) {
    CEDAR_LOG_ERROR("constrained decoding: a grammar compiler could not be created: %s", e.what());
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) break;
    std::shared_ptr<Flight> flight = std::move(queue_.front());
    queue_.pop_front();
    if (flight->done) continue;  // dropped while queued (leave_locked)
    flight->running = true;
    ++stats_.running;
    lock.unlock();
    Result<Grammar> result = Status(StatusCode::kInternal, "constrained decoding: no grammar compiler");
    // Nothing a compilation throws may leave this thread (it would end the process).
    try {
      if (compiler) result = flight->job(*compiler);
    } catch (const std::bad_alloc&) {
      result = invalid_argument("the constraint needs more memory to compile than this server can give it");
    } catch (const std::length_error&) {
      result = invalid_argument("the constraint needs more memory to compile than this server can give it");
    } catch (const std::exception& e) {
      result = invalid_argument(e.what());
    } catch (...) {
      result = invalid_argument("the constraint could not be compiled");
    }
    lock.lock();
    --stats_.running;
    ++stats_.compiled;
    flight->running = false;
    flight->done = true;
    flight->result = std::move(result);
    flight->job = nullptr;  // what it captured (the spec's text) goes now
    auto it = in_flight_.find(flight->key);
    if (it != in_flight_.end() && it->second == flight) in_flight_.erase(it);
    done_cv_.notify_all();
    if (flight->overdue) {
      --stats_.overdue;
      // A replacement took this thread's place: leave the pool if it is now larger than asked.
      if (live_ - stats_.overdue > std::max(1, options_.threads)) break;
    }
  }
  --live_;
  exited_.push_back(id);
}

void CompileExecutor::leave_locked(const std::shared_ptr<Flight>& flight) {
  --flight->waiters;
  --waiters_;
  if (flight->done) return;
  const bool past = Clock::now() >= flight->deadline;
  if (!flight->running && (flight->waiters == 0 || past)) {
    // Not started: drop it (the worker skips a done flight it finds in the queue).
    flight->done = true;
    flight->result = Status(StatusCode::kInternal, "dropped");
    flight->job = nullptr;
    ++stats_.dropped;
    in_flight_.erase(flight->key);
    std::erase(queue_, flight);
    done_cv_.notify_all();
  } else if (flight->running && past && !flight->overdue) {
    // Overdue and not interruptible: give its thread a replacement so the queue keeps moving.
    flight->overdue = true;
    ++stats_.overdue;
    if (stats_.overdue <= options_.max_overdue && live_ - stats_.overdue < std::max(1, options_.threads))
      spawn_locked();
  }
}

Result<CompileExecutor::Grammar> CompileExecutor::run(const std::string& key, const Job& job,
                                                      const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return failed_precondition("the server is shutting down");
  const std::string limit = seconds_text(options_.timeout_seconds);
  const Status overdue = invalid_argument("compiling the constraint took longer than the " + limit +
                                          " s this server allows (--grammar-compile-timeout); use a smaller "
                                          "schema or pattern");
  // Every waiter holds a request thread: past the cap, answer at once.
  if (waiters_ >= options_.max_waiters)
    return resource_exhausted(std::to_string(options_.max_waiters) +
                              " requests are already waiting for constraint compilations; retry in a few seconds");
  std::shared_ptr<Flight> flight;
  if (auto it = in_flight_.find(key); it != in_flight_.end()) {
    flight = it->second;
    if (Clock::now() >= flight->deadline) {
      ++stats_.timed_out;
      return overdue;
    }
    ++stats_.joined;
  } else {
    if (static_cast<int>(queue_.size()) >= options_.max_queued)
      return resource_exhausted(std::to_string(queue_.size()) +
                                " constraints are already waiting to be compiled; retry in a few seconds");
    flight = std::make_shared<Flight>();
    flight->key = key;
    flight->job = job;
    flight->deadline = Clock::now() + timeout_;
    in_flight_.emplace(key, flight);
    queue_.push_back(flight);
    work_cv_.notify_one();
  }
  ++flight->waiters;
  ++waiters_;
  for (;;) {
    if (flight->done) {
      Result<Grammar> result = flight->result;
      leave_locked(flight);
      return result;
    }
    if (stop_) {
      leave_locked(flight);
      return failed_precondition("the server is shutting down");
    }
    const auto now = Clock::now();
    if (now >= flight->deadline) {
      ++stats_.timed_out;
      const bool started = flight->running;
      leave_locked(flight);
      // Never started: the compile threads were busy with others, which is not this request's fault.
      if (!started)
        return resource_exhausted("the constraint compilers were busy for " + limit +
                                  " s (--grammar-compile-timeout); retry in a few seconds");
      return overdue;
    }
    if (cancelled) {
      lock.unlock();
      const bool gone = cancelled();
      lock.lock();
      if (gone) {
        leave_locked(flight);
        return failed_precondition("the client went away");
      }
      if (flight->done) continue;
    }
    done_cv_.wait_until(lock, std::min(flight->deadline, now + kPollInterval));
  }
}

CompileExecutor::Stats CompileExecutor::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.threads = live_;
  s.queued = static_cast<int>(queue_.size());
  s.waiters = waiters_;
  return s;
}

}  // namespace cedar::constrain
