// make-tiny and inspect through the binary: the tiny checkpoint loads completely, its layer table has
// the released model's modes and borrowings, and damaged checkpoints fail with one clear error.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "e2e_util.h"

namespace cedar::e2e {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json inspect_json(const std::string& flag_and_path) {
  RunResult r = run_cedar_stdout("inspect " + flag_and_path + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return json::parse(r.output, nullptr, false);
}

TEST(Cli, HelpListsCommands) {
  RunResult r = run_cedar("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* cmd : {"inspect", "make-tiny", "generate"}) EXPECT_NE(r.output.find(cmd), std::string::npos) << cmd;
  EXPECT_EQ(run_cedar("no-such-command").exit_code, 2);
  EXPECT_EQ(run_cedar("inspect --bogus-flag").exit_code, 2);
}

TEST(Cli, TinyCheckpointHasReleasedLayerTable) {
  const std::string& dir = shared_tiny_checkpoint();
  ASSERT_TRUE(fs::exists(dir + "/config.json")) << dir;
  // >= 2 shards plus the index, and the tokenizer files.
  int shards = 0;
  for (auto& e : fs::directory_iterator(dir)) shards += e.path().extension() == ".safetensors";
  EXPECT_GE(shards, 2);
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir + "/tokenizer.json"));

  RunResult text = run_cedar("inspect -m " + dir);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("all match the inventory"), std::string::npos) << text.output;

  json tiny = inspect_json("-m " + dir);
  json released = inspect_json("--config " + std::string(CEDAR_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json");
  ASSERT_EQ(tiny["layers"].size(), 43u);
  ASSERT_EQ(released["layers"].size(), 43u);
  for (size_t l = 0; l < 43; ++l) {
    for (const char* k : {"mode", "kv_from", "index_keys_from", "topk_from", "candidate", "candidate_from",
                          "compress_ratio", "rope_theta", "yarn", "engram", "dspark_target", "dspark_stage"})
      EXPECT_EQ(tiny["layers"][l][k], released["layers"][l][k]) << "layer " << l << " field " << k;
  }
}

// Copies the shared checkpoint so a test can damage it.
std::string copy_checkpoint(const std::string& name) {
  const std::string dst = test_dir(name);
  fs::remove_all(dst);
  fs::copy(shared_tiny_checkpoint(), dst, fs::copy_options::recursive);
  return dst;
}

std::string first_shard(const std::string& dir) { return dir + "/model-00001-of-00004.safetensors"; }

// Rewrites a shard's JSON header through `edit` (the data section is kept as is).
void edit_header(const std::string& path, const std::function<void(json&)>& edit) {
  std::string bytes = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, n));
  edit(header);
  std::string h = header.dump();
  while ((8 + h.size()) % 8) h += ' ';
  uint64_t m = h.size();
  std::string out(reinterpret_cast<const char*>(&m), 8);
  write_file(path, out + h + bytes.substr(8 + n));
}

TEST(Cli, TruncatedShardNamesFile) {
  const std::string dir = copy_checkpoint("truncated");
  const std::string shard = first_shard(dir);
  fs::resize_file(shard, fs::file_size(shard) - 100);
  RunResult r = run_cedar("inspect -m " + dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model-00001-of-00004.safetensors"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Segmentation"), std::string::npos);
}

TEST(Cli, HeaderLyingAboutOffsetsNamesTensor) {
  const std::string dir = copy_checkpoint("lying_offsets");
  edit_header(first_shard(dir), [](json& h) {
    auto& t = h["embed.weight"];
    t["data_offsets"][1] = t["data_offsets"][1].get<uint64_t>() + 1000000000ull;
  });
  RunResult r = run_cedar("inspect -m " + dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("embed.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model-00001-of-00004.safetensors"), std::string::npos) << r.output;
}

TEST(Cli, WrongDtypeNamesTensor) {
  const std::string dir = copy_checkpoint("wrong_dtype");
  edit_header(first_shard(dir), [](json& h) { h["embed.weight"]["dtype"] = "F16"; });  // same size, wrong type
  RunResult r = run_cedar("inspect -m " + dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("embed.weight"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("expected BF16"), std::string::npos) << r.output;
}

TEST(Cli, MissingTensorIsListed) {
  const std::string dir = copy_checkpoint("missing_tensor");
  edit_header(first_shard(dir), [](json& h) { h.erase("norm.weight"); });
  json index = json::parse(read_file(dir + "/model.safetensors.index.json"));
  index["weight_map"].erase("norm.weight");
  write_file(dir + "/model.safetensors.index.json", index.dump());
  RunResult r = run_cedar("inspect -m " + dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("missing tensors (1)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("norm.weight"), std::string::npos) << r.output;
}

TEST(Cli, ConfigOnlyInspectReportsReleasedCounts) {
  json j = inspect_json("--config " + std::string(CEDAR_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json");
  EXPECT_NEAR(j["params"]["backbone"].get<double>() / 1e9, 552.0, 0.5);
  EXPECT_NEAR(j["params"]["engram"].get<double>() / 1e9, 196.6, 0.1);
  EXPECT_EQ(j["memory"]["kv_global_bytes_per_token"].get<double>(), 890.0);
}

}  // namespace
}  // namespace cedar::e2e
