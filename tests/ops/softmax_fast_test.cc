// fast::softmax_row_bf16 against the exponentials computed in double: each written probability is the
// bf16 rounding of a value within a few f32 ulps of exp(s*scale - max), so it is within one bf16 ulp
// of the correctly rounded bf16 of the exact value; the returned sum is within n f32 roundings (plus
// the exp error) of the exact sum.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/formats/formats.h"
#include "ops/attention/softmax_fast.h"
#include "ops_test_util.h"

namespace cedar::ops {
namespace {

TEST(SoftmaxFast, RowMatchesExactExponentialsWithinTheirRoundings) {
  std::mt19937 rng(11);
  for (size_t n : {1u, 7u, 16u, 33u, 1000u}) {
    std::vector<float> s(n);
    std::normal_distribution<float> normal(0.0f, 4.0f);
    for (float& v : s) v = normal(rng);
    const float scale = 0.125f;
    double max_scaled = -INFINITY;
    for (float v : s) max_scaled = std::max(max_scaled, static_cast<double>(v * scale));
    std::vector<double> exact(n);
    double exact_sum = 0;
    for (size_t j = 0; j < n; ++j) {
      exact[j] = std::exp(static_cast<double>(s[j] * scale - static_cast<float>(max_scaled)));
      exact_sum += exact[j];
    }
    std::vector<float> row = s;
    const float sum = fast::softmax_row_bf16(row.data(), n, scale);
    for (size_t j = 0; j < n; ++j) {
      ASSERT_EQ(row[j], round_bf16(row[j])) << "not a bf16 value at " << j;
      // one bf16 ulp of the exact value (bf16 rounding of a value a few f32 ulps off)
      ASSERT_LE(std::fabs(row[j] - exact[j]), 2 * testing::kUBf16 * exact[j] + 1e-30) << "n " << n << " j " << j;
    }
    EXPECT_LE(std::fabs(sum - exact_sum), (n + 8) * 4 * testing::kU32 * exact_sum) << "n " << n;
  }
}

}  // namespace
}  // namespace cedar::ops
