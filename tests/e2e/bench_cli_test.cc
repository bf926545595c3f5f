// cedar bench --rounds through the binary: every round runs each thread count once, and the scaling
// rows are the per-round quotients of the result rows (and of the probes) they summarise.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "e2e_util.h"

namespace cedar::e2e {
namespace {

using nlohmann::json;

TEST(BenchCli, RoundsRunEveryThreadCountAndReportPerRoundRatios) {
  RunResult r = run_cedar_stdout("bench -m " + shared_tiny_checkpoint() +
                                 " -p 8 -n 2 -t 1,2 -r 1 --rounds 3 -o json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);

  // (round, threads, test) -> tok/s; every combination once.
  std::map<std::tuple<int, int, std::string>, double> speed;
  for (const json& row : j["results"]) {
    const auto key = std::make_tuple(row["round"].get<int>(), row["threads"].get<int>(), row["test"].get<std::string>());
    EXPECT_EQ(speed.count(key), 0u);
    speed[key] = row["tok_s_mean"].get<double>();
    EXPECT_GT(speed[key], 0.0);
  }
  EXPECT_EQ(speed.size(), 3u * 2u * 2u);
  std::map<std::pair<int, int>, double> bandwidth;  // (round, threads) -> GB/s
  for (const json& m : j["machine"]) bandwidth[{m["round"].get<int>(), m["threads"].get<int>()}] = m["read_bandwidth_gb_s"];
  ASSERT_EQ(bandwidth.size(), 6u);

  ASSERT_EQ(j["scaling"].size(), 2u);  // pp8 and tg2, 2 threads over 1
  for (const json& s : j["scaling"]) {
    EXPECT_EQ(s["threads"].get<int>(), 2);
    EXPECT_EQ(s["base_threads"].get<int>(), 1);
    const std::string test = s["test"];
    const std::vector<double> ratios = s["tok_s_ratio_by_round"], bw = s["read_bandwidth_ratio_by_round"];
    ASSERT_EQ(ratios.size(), 3u);
    ASSERT_EQ(bw.size(), 3u);
    for (int round = 0; round < 3; ++round) {
      const double want = speed[{round, 2, test}] / speed[{round, 1, test}];
      EXPECT_NEAR(ratios[round], want, 1e-9 * want) << test << " round " << round;
      const double want_bw = bandwidth[{round, 2}] / bandwidth[{round, 1}];
      EXPECT_NEAR(bw[round], want_bw, 1e-9 * want_bw) << "round " << round;
    }
    std::vector<double> sorted = ratios;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_DOUBLE_EQ(s["tok_s_ratio_median"].get<double>(), sorted[1]);
  }

  RunResult text = run_cedar("bench -m " + shared_tiny_checkpoint() + " -p 0 -n 2 -t 1,2 -r 1 --rounds 2");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("round by round"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("| round | numerics |"), std::string::npos) << text.output;

  EXPECT_TRUE(refused_with("bench -m " + shared_tiny_checkpoint() + " -p 0 -n 2 --rounds 0", "--rounds must be >= 1"));
  EXPECT_TRUE(refused_with("bench -m " + shared_tiny_checkpoint() + " --memory-budget 100% --rounds 2",
                           "--rounds applies to the resident bench"));
}

}  // namespace
}  // namespace cedar::e2e
