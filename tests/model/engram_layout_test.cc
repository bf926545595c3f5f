// Engram primes for the released config against the values in spec §4.3 (reproduced there with
// sympy): 48 distinct ascending primes, first and last of each layer, and the row sums.
#include "spec/engram_layout.h"

#include <gtest/gtest.h>

#include <set>

#include "model_test_util.h"

namespace cedar::model {
namespace {

TEST(EngramLayout, ReleasedPrimes) {
  const EngramLayout L = make_engram_layout(testing::released_v41());
  ASSERT_EQ(L.primes.size(), 2u);
  std::vector<int64_t> all;
  for (const auto& layer : L.primes)
    for (const auto& order : layer)
      for (int64_t p : order) all.push_back(p);
  ASSERT_EQ(all.size(), 48u);
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 48u);
  EXPECT_EQ(all[0], 16000057);
  EXPECT_EQ(all[1], 16000079);
  EXPECT_EQ(all[2], 16000081);
  EXPECT_EQ(all[23], 16000463);
  EXPECT_EQ(all[24], 16000477);
  EXPECT_EQ(all[47], 16000889);
  EXPECT_EQ(L.rows[0], 384006168);
  EXPECT_EQ(L.rows[1], 384016682);
  EXPECT_EQ(L.offsets[0][0], 0);
  EXPECT_EQ(L.offsets[0][1], 16000057);
  EXPECT_EQ(L.n_columns(), 24);
}

TEST(EngramLayout, PrimalityAgainstTrialDivision) {
  for (uint64_t n = 0; n < 20000; ++n) {
    bool trial = n >= 2;
    for (uint64_t d = 2; d * d <= n && trial; ++d) trial = n % d != 0;
    ASSERT_EQ(is_prime_u64(n), trial) << n;
  }
  EXPECT_TRUE(is_prime_u64(18446744073709551557ull));   // largest 64-bit prime
  EXPECT_FALSE(is_prime_u64(3215031751ull));            // strong pseudoprime to bases 2,3,5,7
}

}  // namespace
}  // namespace cedar::model
