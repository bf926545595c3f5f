#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>

#include "core/check.h"

namespace cedar {

namespace {

// How long a worker (or the waiting caller) spins before it sleeps: longer than the serial gaps
// between the parallel regions of one decode step, short enough that an idle pool costs nothing.
// After the first kPauseSpin it yields the core between checks, so that on an oversubscribed machine
// (other processes, more threads than cores) a spinning thread does not starve the one it waits for.
constexpr auto kSpin = std::chrono::microseconds(200);
constexpr auto kPauseSpin = std::chrono::microseconds(20);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done() or kSpin elapsed; true when done() became true.
template <typename Done>
bool spin_until(Done&& done) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - start >= kSpin) return done();
    if (now - start >= kPauseSpin) sched_yield();
  }
}

constexpr uint64_t kClaimed = ~uint64_t{0};
constexpr uint64_t kStolen = ~uint64_t{0} - 1;

}  // namespace

int hardware_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(std::max(1, n_threads)),
      claim_(new std::atomic<uint64_t>[static_cast<size_t>(n_threads_)]),
      done_(new std::atomic<uint64_t>[static_cast<size_t>(n_threads_)]) {
  for (int i = 0; i < n_threads_; ++i) {
    claim_[i].store(kStolen);
    done_[i].store(0);
  }
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunk(int index) {
  // Split [0, n) into n_threads_ chunks aligned to grain_.
  const size_t units = (n_ + grain_ - 1) / grain_;
  const size_t per = units / n_threads_, extra = units % n_threads_;
  const size_t u0 = index * per + std::min<size_t>(index, extra);
  const size_t u1 = u0 + per + (static_cast<size_t>(index) < extra ? 1 : 0);
  const size_t b = std::min(n_, u0 * grain_), e = std::min(n_, u1 * grain_);
  if (b < e) fn_(ctx_, b, e, index);
}

void ThreadPool::run(size_t n, size_t grain, TaskFn fn, void* ctx) {
  if (n == 0) return;
  if (n_threads_ == 1 || n <= grain) {
    fn(ctx, 0, n, 0);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  n_ = n;
  grain_ = std::max<size_t>(1, grain);
  const uint64_t gen = generation_.load() + 1;
  for (int i = 1; i < n_threads_; ++i) claim_[i].store(gen, std::memory_order_relaxed);
  generation_.store(gen);  // seq_cst: publishes the job, ordered before the sleeper check
  if (sleeping_workers_.load() > 0) {
    // A worker that counted itself as sleeping either still holds the mutex (and will see the new
    // generation when it checks) or waits on the condition variable (and gets this notification).
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_start_.notify_all();
  }
  run_chunk(0);
  // Run every chunk no worker has claimed yet.
  for (int i = 1; i < n_threads_; ++i) {
    uint64_t expected = gen;
    if (claim_[i].compare_exchange_strong(expected, kStolen)) run_chunk(i);
  }
  const auto all_done = [&] {
    for (int i = 1; i < n_threads_; ++i)
      if (claim_[i].load(std::memory_order_acquire) == kClaimed && done_[i].load(std::memory_order_acquire) != gen)
        return false;
    return true;
  };
  if (spin_until(all_done)) return;
  std::unique_lock<std::mutex> lock(mu_);
  caller_sleeping_.store(true);
  cv_done_.wait(lock, all_done);
  caller_sleeping_.store(false);
}

void ThreadPool::worker_main(int index) {
  uint64_t seen = 0;
  for (;;) {
    const auto has_job = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(has_job)) {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_workers_.fetch_add(1);
      cv_start_.wait(lock, [&] { return generation_.load() != seen; });
      sleeping_workers_.fetch_sub(1);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    // The claim succeeds only while this job's chunk is still unclaimed: the job's fields are then
    // stable until this worker reports it done (the caller cannot finish the job without it).
    uint64_t expected = seen;
    if (!claim_[index].compare_exchange_strong(expected, kClaimed)) continue;
    run_chunk(index);
    done_[index].store(seen);
    if (caller_sleeping_.load()) {
      { std::lock_guard<std::mutex> lock(mu_); }
      cv_done_.notify_one();
    }
  }
}

namespace {
int g_default_threads = 0;
}

void ThreadPool::set_default_threads(int n) { g_default_threads = n; }

ThreadPool& ThreadPool::global() {
  static std::unique_ptr<ThreadPool> pool = [] {
    int n = g_default_threads;
    if (n <= 0) {
      if (const char* env = std::getenv("CEDAR_THREADS")) n = std::atoi(env);
    }
    if (n <= 0) n = hardware_threads();
    return std::make_unique<ThreadPool>(n);
  }();
  return *pool;
}

}  // namespace cedar
