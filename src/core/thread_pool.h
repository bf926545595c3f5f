// A persistent thread pool for data-parallel loops. Threads are created once; a parallel_for
// call hands each worker a contiguous range of [0, n) and waits for all of them. No allocation
// per call (the callable is passed by pointer), so it is safe to use inside the decode loop.
//
// A decode step issues hundreds of short parallel regions per token, often tens of microseconds
// apart. Waking sleeping threads through a futex for each costs more than the region itself, so
// workers (and the caller, waiting for them) spin on atomics for a short while before they sleep on
// a condition variable; the mutex and the wake-up system call are only used when someone sleeps.
// A job is cut into a few chunks per thread (kChunksPerThread), claimed one at a time by whichever
// thread is free, the caller included: a thread the OS has descheduled or slowed (an oversubscribed
// or noisy machine) leaves its share to the others instead of holding up the region. Which thread
// runs a chunk never changes the chunk's bounds, so results stay independent of timing. One thread
// at a time may call parallel_for.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
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
  // Enough chunks to even out a slow thread, few enough that claiming them costs nothing.
  static constexpr size_t kChunksPerThread = 4;
  static constexpr int kMaxThreads = 4096;  // chunk counts must fit the 16-bit fields of next_

  void run(size_t n, size_t grain, TaskFn fn, void* ctx);
  void worker_main(int index);
  // Claims and runs chunks of the current job until none is left; true when the last chunk it
  // finished completed the job.
  bool run_chunks(int thread);
  void run_chunk(size_t chunk, size_t chunks, int thread);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  std::atomic<uint64_t> generation_{0};  // bumped once per job (and at shutdown): wakes the workers
  // The current job's generation (high 32 bits) with its chunk count and next unclaimed chunk
  // (next_), or with the number of chunks finished (finished_).
  std::atomic<uint64_t> next_{0}, finished_{0};
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  // The current job: written before next_ publishes it, read only by a thread holding one of its
  // chunks.
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  size_t n_ = 0;
  size_t grain_ = 1;
};

// Number of hardware threads usable by this process (sched affinity aware).
int hardware_threads();

}  // namespace cedar
