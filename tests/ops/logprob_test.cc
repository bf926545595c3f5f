// ops/sample/logprob.h: the log-softmax normaliser against a long-double computation, and top-k against a
// full stable sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops/sample/logprob.h"
#include "ops/sample/sample.h"
#include "ops_test_util.h"

namespace cedar::ops {
namespace {

using namespace testing;  // the shared helpers of ops_test_util.h

TEST(Logprob, NormaliserMatchesLongDouble) {
  Rng rng(7);
  for (size_t n : {1, 2, 17, 1000, 129280}) {
    Normal d(0.0f, 4.0f);
    std::vector<float> x(n);
    for (float& v : x) v = d(rng);
    const LogSoftmaxNorm z = log_softmax_norm(x.data(), n);
    long double m = *std::max_element(x.begin(), x.end()), s = 0;
    for (float v : x) s += std::exp(static_cast<long double>(v) - m);
    EXPECT_EQ(z.max, static_cast<float>(m));
    double total = 0;
    for (size_t i = 0; i < n; i += std::max<size_t>(1, n / 50)) {
      const long double want = static_cast<long double>(x[i]) - m - std::log(s);
      EXPECT_NEAR(z.log_prob(x.data(), static_cast<int32_t>(i)), static_cast<double>(want), 1e-9 * (1 + std::fabs(static_cast<double>(want))));
    }
    for (size_t i = 0; i < n; ++i) total += std::exp(z.log_prob(x.data(), static_cast<int32_t>(i)));
    EXPECT_NEAR(total, 1.0, 1e-9) << n;
  }
  // Shift invariance and a hand case: two equal logits -> log(1/2) each.
  std::vector<float> two = {3.0f, 3.0f};
  EXPECT_DOUBLE_EQ(log_softmax_norm(two.data(), 2).log_prob(two.data(), 0), -std::log(2.0));
  std::vector<float> big = {1000.0f, 1000.0f, -1e30f};
  EXPECT_NEAR(log_softmax_norm(big.data(), 3).log_prob(big.data(), 1), -std::log(2.0), 1e-15);
  // Only the first n count.
  std::vector<float> pad = {0.0f, 0.0f, 50.0f};
  EXPECT_DOUBLE_EQ(log_softmax_norm(pad.data(), 2).log_prob(pad.data(), 0), -std::log(2.0));
}

TEST(Logprob, TopKMatchesStableSort) {
  Rng rng(11);
  for (size_t n : {1, 5, 64, 3000})
    for (size_t k : {1, 2, 5, 20, 100}) {
      UniformInt<int> d(-8, 8);  // many ties
      std::vector<float> x(n);
      for (float& v : x) v = static_cast<float>(d(rng)) * 0.5f;
      std::vector<int32_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
      std::vector<int32_t> got(k, -7);
      const size_t m = top_k_ids(x.data(), n, k, got.data());
      ASSERT_EQ(m, std::min(n, k));
      for (size_t i = 0; i < m; ++i) EXPECT_EQ(got[i], order[i]) << "n " << n << " k " << k << " i " << i;
      EXPECT_EQ(got[0], argmax(x.data(), n));
    }
  std::vector<float> x = {1, 2, 3};
  int32_t none = -1;
  EXPECT_EQ(top_k_ids(x.data(), 3, 0, &none), 0u);
  EXPECT_EQ(none, -1);
}

}  // namespace
}  // namespace cedar::ops
