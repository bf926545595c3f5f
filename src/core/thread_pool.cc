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

// A share word packs the job's generation (high 32 bits), the share's next unclaimed chunk (bits
// 16-31) and one past its last chunk (low 16 bits), so one compare-and-swap both checks that the job
// is still the current one and claims a chunk of it, and nothing of a job is read before one of its
// chunks is claimed.
constexpr int kFrontShift = 16;
constexpr uint64_t kIndexMask = 0xFFFF;

uint64_t pack_share(uint32_t gen, size_t front, size_t back) {
  return (uint64_t{gen} << 32) | (uint64_t{front} << kFrontShift) | uint64_t{back};
}
uint32_t share_gen(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
size_t share_front(uint64_t w) { return (w >> kFrontShift) & kIndexMask; }
size_t share_back(uint64_t w) { return w & kIndexMask; }

// Claims the front (owner) or back (another thread) chunk of a share of job `gen`; false when the
// share is empty or belongs to another job.
bool claim(std::atomic<uint64_t>& word, uint32_t gen, bool front, size_t& chunk) {
  uint64_t w = word.load(std::memory_order_acquire);
  for (;;) {
    if (share_gen(w) != gen || share_front(w) >= share_back(w)) return false;
    const uint64_t next = front ? w + (uint64_t{1} << kFrontShift) : w - 1;
    if (word.compare_exchange_weak(w, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
      chunk = front ? share_front(w) : share_back(w) - 1;
      return true;
    }
  }
}

}  // namespace

int hardware_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(std::clamp(n_threads, 1, kMaxThreads)), shares_(std::make_unique<Share[]>(n_threads_)) {
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

void ThreadPool::run_chunk(size_t chunk, size_t chunks, int thread) {
  // Split [0, n) into `chunks` ranges aligned to grain_; the bounds depend on n, grain and the
  // chunk count only, never on which thread runs them.
  const size_t units = (n_ + grain_ - 1) / grain_;
  const size_t per = units / chunks, extra = units % chunks;
  const size_t u0 = chunk * per + std::min(chunk, extra);
  const size_t u1 = u0 + per + (chunk < extra ? 1 : 0);
  const size_t b = std::min(n_, u0 * grain_), e = std::min(n_, u1 * grain_);
  if (b < e) fn_(ctx_, b, e, thread);
}

size_t ThreadPool::run_chunks(int thread, uint32_t gen) {
  size_t ran = 0, chunk = 0;
  // The job's fields are read only once a chunk of it is held: they stay put until it is reported
  // finished, which this thread's own count still holds back.
  while (claim(shares_[thread].word, gen, true, chunk)) {
    run_chunk(chunk, chunks_, thread);
    ++ran;
  }
  for (int i = 1; i < n_threads_; ++i) {
    std::atomic<uint64_t>& other = shares_[(thread + i) % n_threads_].word;
    while (claim(other, gen, false, chunk)) {
      run_chunk(chunk, chunks_, thread);
      ++ran;
    }
  }
  return ran;
}

bool ThreadPool::report_finished(uint32_t gen, size_t ran) {
  if (ran == 0) return false;
  // Read before the report: once the job is finished the caller may start the next one.
  const uint64_t all_done = (uint64_t{gen} << 32) | chunks_;
  // seq_cst, like the caller's store to caller_sleeping_ and its load in job_done: a Dekker-style
  // pair (each side writes, then reads the other's flag) needs a total order, or on weakly ordered
  // CPUs both could miss the other's write and the caller would sleep with the job finished.
  return finished_.fetch_add(ran) + ran == all_done;
}

void ThreadPool::run(size_t n, size_t grain, TaskFn fn, void* ctx) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  const size_t units = (n + grain - 1) / grain;
  if (n_threads_ == 1 || units <= 1) {
    fn(ctx, 0, n, 0);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  n_ = n;
  grain_ = grain;
  const size_t chunks = std::min({units, static_cast<size_t>(n_threads_) * kChunksPerThread, kMaxChunks});
  chunks_ = chunks;
  const uint32_t gen = static_cast<uint32_t>(generation_.load() + 1);
  const uint64_t all_done = (uint64_t{gen} << 32) | chunks;
  finished_.store(uint64_t{gen} << 32, std::memory_order_relaxed);
  for (int t = 0; t < n_threads_; ++t) {  // thread t's share: chunks [t·chunks/T, (t+1)·chunks/T)
    const size_t T = static_cast<size_t>(n_threads_), i = static_cast<size_t>(t);
    shares_[t].word.store(pack_share(gen, i * chunks / T, (i + 1) * chunks / T), std::memory_order_release);
  }
  generation_.store(gen);  // seq_cst: wakes the spinners, ordered before the sleeper check
  if (sleeping_workers_.load() > 0) {
    // A worker that counted itself as sleeping either still holds the mutex (and will see the new
    // generation when it checks) or waits on the condition variable (and gets this notification).
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_start_.notify_all();
  }
  report_finished(gen, run_chunks(0, gen));
  const auto job_done = [&] { return finished_.load() == all_done; };
  if (spin_until(job_done)) return;
  std::unique_lock<std::mutex> lock(mu_);
  caller_sleeping_.store(true);
  cv_done_.wait(lock, job_done);
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
    // Chunks of whichever job is current (a late worker may find a newer one, or none left).
    const uint32_t gen = static_cast<uint32_t>(seen);
    if (report_finished(gen, run_chunks(index, gen)) && caller_sleeping_.load()) {
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
