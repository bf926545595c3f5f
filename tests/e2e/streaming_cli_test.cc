// --memory-budget through the binary: inspect plans the released config, generate streams the tiny
// checkpoint with the same ids as a resident run, bench reports streaming figures, and budgets that
// cannot work fail with a message naming the fix.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "e2e_util.h"

namespace cedar::e2e {
namespace {

using nlohmann::json;

// The JSON a command printed last (stderr lines arrive first: stdout is flushed at exit).
json last_json(const std::string& out) {
  size_t at = out.rfind("\n{");
  at = at == std::string::npos ? 0 : at + 1;
  return json::parse(out.substr(at));
}

const std::string kReleased = std::string(CEDAR_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json";

TEST(StreamingCli, InspectPlansTheReleasedConfig) {
  for (int gib : {64, 128, 256}) {
    RunResult r = run_cedar_stdout("inspect --config " + kReleased + " --memory-budget " + std::to_string(gib) + "G --json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const json p = last_json(r.output)["residency"];
    EXPECT_TRUE(p["streaming"].get<bool>());
    EXPECT_LE(p["resident_bytes"]["total"].get<int64_t>(), int64_t{gib} << 30);
    EXPECT_LT(p["experts"]["resident"].get<int64_t>(), 40 * 384);
    EXPECT_GT(p["ssd_bytes_per_decode_token"].get<double>(), 0);
  }
  RunResult text = run_cedar("inspect --config " + kReleased + " --memory-budget 64G");
  EXPECT_NE(text.output.find("residency plan"), std::string::npos) << text.output;
  RunResult small = run_cedar("inspect --config " + kReleased + " --memory-budget 8G");
  EXPECT_EQ(small.exit_code, 1);
  EXPECT_NE(small.output.find("raise --memory-budget to at least"), std::string::npos) << small.output;
}

TEST(StreamingCli, GenerateStreamedGivesTheResidentIds) {
  const std::string& dir = shared_tiny_checkpoint();
  const std::string stats = test_dir("streaming_cli") + "/expert-stats";
  std::filesystem::remove(stats);
  const std::string gen = "generate -m " + dir + " --prompt-ids 5,900,77,1234,6,42,300 -n 8 --json";
  RunResult resident = run_cedar_stdout(gen + " --residency-stats none");
  ASSERT_EQ(resident.exit_code, 0) << resident.output;
  // 37 MiB: the tiny model's 35 MiB of dense weights plus about half of its 2.4 MiB of experts and
  // Engram rows.
  RunResult streamed = run_cedar(gen + " --memory-budget 37M --residency-stats " + stats);
  ASSERT_EQ(streamed.exit_code, 0) << streamed.output;
  EXPECT_NE(streamed.output.find("streaming: budget"), std::string::npos) << streamed.output;
  RunResult streamed_json = run_cedar_stdout(gen + " --memory-budget 37M --residency-stats " + stats);
  ASSERT_EQ(streamed_json.exit_code, 0);
  EXPECT_EQ(last_json(resident.output)["ids"], last_json(streamed_json.output)["ids"]);
  EXPECT_TRUE(std::filesystem::exists(stats));
}

TEST(StreamingCli, BudgetBelowTheDenseWeightsFailsClearly) {
  RunResult r = run_cedar("generate -m " + shared_tiny_checkpoint() + " --prompt-ids 5,6 -n 1 --memory-budget 1M");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("raise --memory-budget to at least"), std::string::npos) << r.output;
  EXPECT_TRUE(refused_with("generate -m " + shared_tiny_checkpoint() + " --prompt-ids 5,6 -n 1 --memory-budget lots",
                           "--memory-budget must be a positive size"));
}

TEST(StreamingCli, BenchReportsStreamingFigures) {
  RunResult r = run_cedar_stdout("bench -m " + shared_tiny_checkpoint() +
                                 " --memory-budget 100%,97% -p 16 -n 4 -t 1 -o json --fio-bandwidth 1000000000");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = last_json(r.output);
  ASSERT_EQ(j["results"].size(), 4u);  // pp and tg for each budget
  EXPECT_FALSE(j["results"][0]["streaming"].get<bool>());
  EXPECT_EQ(j["results"][0]["ssd_bytes_per_token"].get<double>(), 0.0);
  EXPECT_TRUE(j["results"][2]["streaming"].get<bool>());
  EXPECT_GT(j["results"][2]["ssd_bytes_per_token"].get<double>(), 0.0);  // the prefill's first reads
  for (const json& row : j["results"]) EXPECT_GT(row["tok_s"].get<double>(), 0.0);
}

}  // namespace
}  // namespace cedar::e2e
