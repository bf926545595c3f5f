// `cedar kv-report` end to end on the shipped configs: the headline figures, from the real
// config -> layer plan -> cache geometry -> allocation path (expectations hand-worked in spec §5).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace cedar::kv {
namespace {

// Runs a command, returns (exit code, stdout).
std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, ""};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

const std::string kConfig = std::string(CEDAR_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json";

TEST(KvReportCli, HeadlineFiguresFromTheShippedConfigs) {
  const auto [code, out] = run(std::string(CEDAR_BIN) + " kv-report --config " + kConfig + " --json 2>/dev/null");
  ASSERT_EQ(code, 0) << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["context_tokens"].get<int64_t>(), 1048576);
  EXPECT_EQ(j["global_bytes_per_token"].get<double>(), 890.0);
  EXPECT_EQ(j["components_bytes_per_token"]["main_kv"].get<double>(), 720.0);
  EXPECT_EQ(j["components_bytes_per_token"]["index_keys"].get<double>(), 170.0);
  EXPECT_EQ(j["kv_owner_layers"].get<int>(), 4);
  EXPECT_NEAR(j["global_gib"].get<double>(), 0.87, 0.005);
  EXPECT_EQ(j["swa_bytes_per_sequence"].get<uint64_t>(), 43u * 128u * 528u);
  EXPECT_FALSE(j["persists_swa"].get<bool>());
  // 229,016-byte files per 256 tokens: 128 header + 1,024 token ids + 24 boundary + 227,840 KV.
  EXPECT_DOUBLE_EQ(j["persisted_bytes_per_token"].get<double>(), 229016.0 / 256.0);

  const auto& v4 = j["baselines"]["deepseek-v4-flash"];
  EXPECT_DOUBLE_EQ(v4["global_bytes_per_token"].get<double>(), 3514.25);
  EXPECT_EQ(v4["kv_owner_layers"].get<int>(), 41);
  EXPECT_TRUE(v4["persists_swa"].get<bool>());
  EXPECT_EQ(v4["swa_bytes_per_sequence"].get<uint64_t>(), 44u * 128u * 584u);
  const auto& dense = j["baselines"]["deepseek-llm-67b"];
  EXPECT_EQ(dense["global_bytes_per_token"].get<double>(), 389120.0);
  EXPECT_EQ(dense["swa_bytes_per_sequence"].get<uint64_t>(), 0u);

  const auto& r = j["ratios"];
  EXPECT_NEAR(r["main_over_v4_flash_global"].get<double>(), 890.0 / 3514.25, 1e-12);
  EXPECT_NEAR(r["dense_67b_over_main_global"].get<double>(), 437.2, 0.05);
  // "1/8": at the prefix length where V4-Flash's SWA equals its global KV.
  EXPECT_NEAR(r["main_over_v4_flash_persisted_when_swa_is_half"].get<double>(), 1.0 / 8.0, 0.005);
}

TEST(KvReportCli, TextOutputAndErrors) {
  const auto [code, out] = run(std::string(CEDAR_BIN) + " kv-report --config " + kConfig + " --context 4096");
  EXPECT_EQ(code, 0);
  EXPECT_NE(out.find("890.00 B/token"), std::string::npos) << out;
  EXPECT_NE(out.find("437.2x"), std::string::npos) << out;
  EXPECT_EQ(run(std::string(CEDAR_BIN) + " kv-report 2>&1").first, 2);
  EXPECT_EQ(run(std::string(CEDAR_BIN) + " kv-report --config " + kConfig + " --context 0 2>&1").first, 2);
  const auto [missing, msg] = run(std::string(CEDAR_BIN) + " kv-report --config /nonexistent/config.json 2>&1");
  EXPECT_EQ(missing, 1);
  EXPECT_NE(msg.find("/nonexistent/config.json"), std::string::npos) << msg;
}

}  // namespace
}  // namespace cedar::kv
