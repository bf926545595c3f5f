#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

namespace cedar {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 7}) {
    ThreadPool pool(threads);
    for (size_t n : {0u, 1u, 5u, 64u, 1000u}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, 4, [&](size_t b, size_t e, int) {
        for (size_t i = b; i < e; ++i) hits[i]++;
      });
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPool, ChunksRespectGrain) {
  ThreadPool pool(3);
  std::vector<std::pair<size_t, size_t>> ranges(3, {0, 0});
  pool.parallel_for(100, 16, [&](size_t b, size_t e, int t) { ranges[t] = {b, e}; });
  for (auto [b, e] : ranges) {
    EXPECT_EQ(b % 16, 0u);
    if (e != 100) {
      EXPECT_EQ(e % 16, 0u);
    }
  }
}

TEST(ThreadPool, ReusableManyTimes) {
  ThreadPool pool(2);
  std::atomic<long> sum{0};
  for (int r = 0; r < 200; ++r)
    pool.parallel_for(10, 1, [&](size_t b, size_t e, int) {
      for (size_t i = b; i < e; ++i) sum += static_cast<long>(i);
    });
  EXPECT_EQ(sum.load(), 200L * 45);
}

TEST(ThreadPool, OversubscribedPoolsCoverEveryIndexOnEveryCall) {
  // More threads than this machine has cores: workers are often not scheduled when a job starts and
  // the caller or another worker runs their chunks; every index must still be covered exactly once,
  // by ranges aligned to the grain.
  for (int threads : {3, 8}) {
    ThreadPool pool(threads);
    for (int r = 0; r < 2000; ++r) {
      const size_t n = 1 + static_cast<size_t>(r * 37) % 300;
      std::vector<std::atomic<int>> hits(n);
      std::mutex mu;
      std::vector<std::pair<size_t, size_t>> ranges;
      pool.parallel_for(n, 4, [&](size_t b, size_t e, int) {
        {
          std::lock_guard<std::mutex> lock(mu);
          ranges.push_back({b, e});
        }
        for (size_t i = b; i < e; ++i) hits[i]++;
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n=" << n << " i=" << i;
      for (const auto& [b, e] : ranges) {
        if (b == e) continue;
        ASSERT_EQ(b % 4, 0u);
        ASSERT_TRUE(e % 4 == 0 || e == n);
      }
    }
  }
}

// Results must not depend on timing: whichever threads run the chunks, the chunk bounds of a call
// are the same every time (only the thread count and the grain decide them).
TEST(ThreadPool, ChunkBoundsDoNotDependOnTiming) {
  for (int threads : {2, 3, 8}) {
    ThreadPool pool(threads);
    for (size_t n : {17u, 100u, 1000u, 5120u}) {
      std::set<std::pair<size_t, size_t>> first;
      for (int r = 0; r < 200; ++r) {
        std::mutex mu;
        std::set<std::pair<size_t, size_t>> ranges;
        pool.parallel_for(n, 16, [&](size_t b, size_t e, int) {
          std::lock_guard<std::mutex> lock(mu);
          ranges.insert({b, e});
        });
        if (r == 0) {
          first = ranges;
          // Disjoint and covering, in order.
          size_t at = 0;
          for (const auto& [b, e] : ranges) {
            ASSERT_EQ(b, at);
            at = e;
          }
          ASSERT_EQ(at, n);
        } else {
          ASSERT_EQ(ranges, first) << "threads " << threads << " n " << n << " call " << r;
        }
      }
    }
  }
}


// A thread stuck in one of its chunks leaves the rest of its share to the others: here the worker
// waits inside its first chunk until every other chunk has run, which only happens when the caller
// takes the worker's remaining chunks from the back of its share.
TEST(ThreadPool, IdleThreadsTakeTheRestOfAStuckThreadsShare) {
  ThreadPool pool(2);
  for (int r = 0; r < 50; ++r) {
    const size_t n = 64;
    std::vector<std::atomic<int>> hits(n);
    std::atomic<size_t> ran_by_caller{0}, done{0};
    std::atomic<int> worker_chunks{0};
    pool.parallel_for(n, 1, [&](size_t b, size_t e, int t) {
      if (t != 0 && worker_chunks.fetch_add(1) == 0) {
        while (done.load() < n - (e - b)) std::this_thread::yield();
      }
      for (size_t i = b; i < e; ++i) hits[i]++;
      if (t == 0) ran_by_caller += e - b;
      done += e - b;
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "call " << r << " i " << i;
    // The worker ran at most the chunk it was stuck in (or nothing, if it joined late).
    ASSERT_LE(worker_chunks.load(), 1) << "call " << r;
    ASSERT_GE(ran_by_caller.load(), n - n / 32) << "call " << r;
  }
}

}  // namespace
}  // namespace cedar
