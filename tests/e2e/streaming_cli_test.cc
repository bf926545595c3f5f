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

// The released vision_config (issue 38: 32 layers, 1024 wide, 16 heads, inter 2816, patch 14, downsample
// 3, at most 1024 image tokens, min_pixels 295936) and the tower's weight bytes in the inspection.
TEST(StreamingCli, InspectShowsTheReleasedVisionTower) {
  RunResult r = run_cedar_stdout("inspect --config " + kReleased + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json v = last_json(r.output)["config"]["vision"];
  ASSERT_TRUE(v.is_object()) << r.output;
  EXPECT_EQ(v["n_layers"], 32);
  EXPECT_EQ(v["dim"], 1024);
  EXPECT_EQ(v["n_heads"], 16);
  EXPECT_EQ(v["inter_dim"], 2816);
  EXPECT_EQ(v["patch_size"], 14);
  EXPECT_EQ(v["downsample"], 3);
  EXPECT_EQ(v["max_n_token"], 1024);
  EXPECT_EQ(v["min_pixels"], 295936);
  // 0.5 B parameters in bf16 (the aligner's 9216x5120 + 5120x5120 alone are 0.07 B): about 1 GB.
  EXPECT_GT(v["weight_bytes"].get<int64_t>(), int64_t{800} << 20);
  EXPECT_LT(v["weight_bytes"].get<int64_t>(), int64_t{1400} << 20);
  RunResult text = run_cedar("inspect --config " + kReleased);
  EXPECT_NE(text.output.find("vision tower: 32 layers x 1024, 16 heads"), std::string::npos) << text.output;
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

// The budget a too-small --memory-budget error names ("at least 37M") works for that run:
// the figure counts the workspace, which grows with the budget itself, and rounds up. Whatever the
// failed budget was, the figure is the same, and one MiB less fails again naming it.
TEST(StreamingCli, SuggestedMemoryBudgetWorks) {
  const std::string& dir = shared_tiny_checkpoint();
  auto suggested = [&](const std::string& budget, const std::string& ids) -> int {
    RunResult r = run_cedar("generate -m " + dir + " --prompt-ids " + ids +
                            " -n 2 --residency-stats none --memory-budget " + budget);
    EXPECT_EQ(r.exit_code, 1) << budget << ": " << r.output;
    const std::string key = "raise --memory-budget to at least ";
    const size_t at = r.output.find(key);
    const size_t unit = at == std::string::npos ? at : r.output.find_first_not_of("0123456789", at + key.size());
    if (unit == std::string::npos || r.output[unit] != 'M' || unit == at + key.size()) {
      ADD_FAILURE() << budget << ": " << r.output;
      return -1;
    }
    return std::stoi(r.output.substr(at + key.size(), unit - at - key.size()));
  };
  const int mib = suggested("1M", "5,6");
  ASSERT_GT(mib, 1);
  for (const char* budget : {"4M", "20M", "33M"}) EXPECT_EQ(suggested(budget, "5,6"), mib) << budget;
  EXPECT_EQ(suggested(std::to_string(mib - 1) + "M", "5,6"), mib);
  // The suggestion works for every prompt length (the KV of a run is not part of the budget).
  for (int length : {1, 7, 64, 300}) {
    std::string ids;
    for (int i = 0; i < length; ++i) ids += (i ? "," : "") + std::to_string(5 + (i * 37) % 900);
    RunResult r = run_cedar("generate -m " + dir + " --prompt-ids " + ids +
                            " -n 4 --residency-stats none --memory-budget " + std::to_string(mib) + "M");
    EXPECT_EQ(r.exit_code, 0) << length << " tokens: " << r.output;
    EXPECT_NE(r.output.find("streaming: budget"), std::string::npos) << r.output;
  }
}

// The streamed completion ends its line before the speed line (stdout and stderr in one pipe, where
// stdout is fully buffered): the speed line starts a line of its own.
TEST(StreamingCli, GenerateEndsTheCompletionLineBeforeTheSpeedLine) {
  for (const char* ids : {"5,900,77", "5,6,7,8,9,10,11,12"}) {
    RunResult r =
        run_cedar("generate -m " + shared_tiny_checkpoint() + " --prompt-ids " + ids + " -n 12 --residency-stats none");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const size_t speed = r.output.find("prefill: ");
    ASSERT_NE(speed, std::string::npos) << r.output;
    ASSERT_GT(speed, 0u);
    EXPECT_EQ(r.output[speed - 1], '\n') << r.output;
  }
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
