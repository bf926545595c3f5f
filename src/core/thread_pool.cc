#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "core/check.h"

namespace cedar {

int hardware_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    ++generation_;
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    grain_ = std::max<size_t>(1, grain);
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  cv_start_.notify_all();
  run_chunk(0);
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [this] { return pending_ == 0; });
}

void ThreadPool::worker_main(int index) {
  size_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (stop_) return;
    }
    run_chunk(index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
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
