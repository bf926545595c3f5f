// A persistent thread pool for data-parallel loops. Threads are created once; a parallel_for
// call hands each worker a contiguous range of [0, n) and waits for all of them. No allocation
// per call (the callable is passed by pointer), so it is safe to use inside the decode loop.
//
// A decode step issues hundreds of short parallel regions per token, often tens of microseconds
// apart. Waking sleeping threads through a futex for each costs more than the region itself, so
// workers (and the caller, waiting for them) spin on atomics for a short while before they sleep on
// a condition variable; the mutex and the wake-up system call are only used when someone sleeps.
// A job is cut into a few chunks per thread (kChunksPerThread), and each thread starts on its own
// contiguous share of them: it claims them front to back with a compare-and-swap on a cache line of
// its own, which no other thread touches until that thread has run out of work. Then it takes
// chunks from the back of the other threads' shares, so a thread the OS has descheduled or slowed
// (an oversubscribed or noisy machine) leaves its share to the others instead of holding up the
// region. A shared counter claimed chunk by chunk cost a contended cache-line transfer per chunk and
// per completion, several thousand per decoded token. Each thread reports the chunks it ran once,
// when it finds none left. Which thread runs a chunk never changes the chunk's bounds, so results
// stay independent of timing. One thread at a time may call parallel_for.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
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
    // fn may be an lvalue (Fn a reference type, possibly to const): the thunk calls it through a
    // pointer to the referred type.
    using F = std::remove_reference_t<Fn>;
    struct Thunk {
      static void call(void* ctx, size_t b, size_t e, int t) { (*static_cast<F*>(ctx))(b, e, t); }
    };
    run(n, grain, &Thunk::call, const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Process-wide pool, sized by set_default_threads() or CEDAR_THREADS or the core count.
  static ThreadPool& global();
  static void set_default_threads(int n);

 private:
  using TaskFn = void (*)(void*, size_t, size_t, int);
  // Enough chunks that the last one (all a finished thread may wait for) is short; claiming one from
  // a thread's own share costs an uncontended compare-and-swap. Decode's regions take tens of
  // microseconds; with 2 threads, 16 chunks each decoded at least as fast as 4
  // (`git show f6bfcca:docs/PERFORMANCE_LOG_2026-12-05.md`).
  static constexpr size_t kChunksPerThread = 16;
  static constexpr int kMaxThreads = 4096;
  static constexpr size_t kMaxChunks = 0xFFFF;  // chunk indices fill the 16-bit fields of a share

  void run(size_t n, size_t grain, TaskFn fn, void* ctx);
  void worker_main(int index);
  // Runs chunks of job `gen`, its own share first, then the others' from the back, until none is
  // left; returns how many it ran.
  size_t run_chunks(int thread, uint32_t gen);
  // Reports `ran` chunks of job `gen` finished; true when they completed the job.
  bool report_finished(uint32_t gen, size_t ran);
  void run_chunk(size_t chunk, size_t chunks, int thread);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  std::atomic<uint64_t> generation_{0};  // bumped once per job (and at shutdown): wakes the workers
  // A thread's share of the current job: the job's generation (high 32 bits), its next unclaimed
  // chunk (bits 16-31) and one past its last (low 16 bits). One cache line each.
  struct alignas(64) Share {
    std::atomic<uint64_t> word{0};
  };
  std::unique_ptr<Share[]> shares_;
  // The current job's generation (high 32 bits) with the number of chunks reported finished.
  alignas(64) std::atomic<uint64_t> finished_{0};
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  // The current job: written before the shares publish it, read only by a thread holding one of its
  // chunks.
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  size_t n_ = 0;
  size_t grain_ = 1;
  size_t chunks_ = 0;
};

// Number of hardware threads usable by this process (sched affinity aware).
int hardware_threads();

}  // namespace cedar
