#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
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

}  // namespace
}  // namespace cedar
