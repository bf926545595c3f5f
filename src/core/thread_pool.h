// A persistent thread pool for data-parallel loops. Threads are created once; a parallel_for
// call hands each worker a contiguous range of [0, n) and waits for all of them. No allocation
// per call (the callable is passed by pointer), so it is safe to use inside the decode loop.
//
// A decode step issues hundreds of short parallel regions per token, often tens of microseconds
// apart. Waking sleeping threads through a futex for each costs more than the region itself, so
// workers (and the caller, waiting for them) spin on atomics for a short while before they sleep on
// a condition variable; the mutex and the wake-up system call are only used when someone sleeps.
// Each worker has one statically assigned chunk, but must claim it first: the caller, after its own
// chunk, claims and runs every chunk no worker has started, so a worker that the OS has not scheduled
// (an oversubscribed machine) delays nothing. Which thread runs a chunk never changes the chunk's
// bounds, so results stay independent of timing. One thread at a time may call parallel_for.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace cedar {

class ThreadPool {
 public:
  // n_threads counts the calling thread: ThreadPool(1) runs everything inline.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) on disjoint chunks covering [0, n). Chunk boundaries are a
  // multiple of `grain` (except the last), so results never depend on timing; they depend on the
  // thread count only if fn's own arithmetic does.
  template <typename Fn>
  void parallel_for(size_t n, size_t grain, Fn&& fn) {
    struct Thunk {
      static void call(void* ctx, size_t b, size_t e, int t) { (*static_cast<Fn*>(ctx))(b, e, t); }
    };
    run(n, grain, &Thunk::call, static_cast<void*>(&fn));
  }

  // Process-wide pool, sized by set_default_threads() or CEDAR_THREADS or the core count.
  static ThreadPool& global();
  static void set_default_threads(int n);

 private:
  using TaskFn = void (*)(void*, size_t, size_t, int);
  void run(size_t n, size_t grain, TaskFn fn, void* ctx);
  void worker_main(int index);
  void run_chunk(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  std::atomic<uint64_t> generation_{0};  // bumped once per job (and at shutdown)
  // Per thread index: claim_ holds the job generation while the chunk is unclaimed, then kClaimed
  // (a worker runs it) or kStolen (the caller runs it); done_ holds the last generation a worker
  // finished its claimed chunk of.
  std::unique_ptr<std::atomic<uint64_t>[]> claim_, done_;
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  // The current job: written before generation_ is bumped, read after it is seen.
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  size_t n_ = 0;
  size_t grain_ = 1;
};

// Number of hardware threads usable by this process (sched affinity aware).
int hardware_threads();

}  // namespace cedar
