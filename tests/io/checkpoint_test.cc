// Checkpoint: single-file and sharded directories, progress reporting, and every way an index and
// its shards can disagree (missing shard, missing tensor, extra tensor, path traversal, truncation).
#include "io/checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "io/safetensors_writer.h"
#include "io_test_util.h"

namespace cedar::io {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

void write_shard(const std::string& path, const std::vector<std::pair<std::string, size_t>>& tensors) {
  SafetensorsWriter w;
  uint8_t seed = 0;
  for (const auto& [name, n] : tensors)
    ASSERT_TRUE(w.add(name, Dtype::kU8, {static_cast<int64_t>(n)}, testing::pattern(n, seed += 16)).ok());
  ASSERT_TRUE(w.write(path).ok());
}

// Shard 1 holds a, c (10 + 30 bytes); shard 2 holds b, d (20 + 40 bytes).
void write_two_shards(const testing::ScratchDir& dir) {
  write_shard(dir.file(kShard1), {{"a", 10}, {"c", 30}});
  write_shard(dir.file(kShard2), {{"b", 20}, {"d", 40}});
}

void write_index(const testing::ScratchDir& dir, const std::map<std::string, std::string>& map) {
  ASSERT_TRUE(write_index_json(dir.path(), 100, map).ok());
}

const std::map<std::string, std::string> kGoodMap = {
    {"a", kShard1}, {"c", kShard1}, {"b", kShard2}, {"d", kShard2}};

TEST(Checkpoint, OpensASingleFile) {
  testing::ScratchDir dir;
  write_shard(dir.file(kSingleFileName), {{"z", 3}, {"y", 5}});
  auto ck = Checkpoint::open(dir.path());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_FALSE(ck->is_sharded());
  EXPECT_EQ(ck->tensor_count(), 2u);
  EXPECT_EQ(ck->total_bytes(), 8u);
  EXPECT_EQ(ck->shard_names(), std::vector<std::string>{kSingleFileName});
  EXPECT_EQ(ck->tensors()[0]->name, "y");
  EXPECT_EQ(ck->tensors()[1]->name, "z");
  EXPECT_FALSE(ck->index_total_size().has_value());
}

TEST(Checkpoint, OpensShardsThroughTheIndex) {
  testing::ScratchDir dir;
  write_two_shards(dir);
  write_index(dir, kGoodMap);
  auto opened = Checkpoint::open(dir.path());
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  const Checkpoint ck = std::move(opened).value();
  EXPECT_TRUE(ck.is_sharded());
  EXPECT_EQ(ck.index_total_size(), std::optional<uint64_t>(100));
  EXPECT_EQ(ck.total_bytes(), 100u);
  EXPECT_EQ(ck.shard_names(), (std::vector<std::string>{kShard1, kShard2}));
  std::vector<std::string> names;
  for (const TensorView* t : ck.tensors()) names.push_back(t->name);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "d"}));
  const TensorView* d = ck.find("d");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->nbytes, 40u);
  EXPECT_EQ(fs::path(d->file).filename(), kShard2);
  EXPECT_EQ(std::vector<uint8_t>(d->data, d->data + d->nbytes), testing::pattern(40, 32));
  // The view lies inside shard 2's mapping: nothing was copied.
  EXPECT_TRUE(ck.shards()[1].mapping().contains(d->data, d->nbytes));
  EXPECT_EQ(ck.find("e"), nullptr);
  EXPECT_EQ(ck.find("d "), nullptr);
  ck.prefetch(*d);
  ck.drop(*d);
  EXPECT_EQ(d->data[0], 32);
  auto missing = ck.require("layers.9.attn.wkv.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'layers.9.attn.wkv.weight'"));
  EXPECT_THAT(missing.status().message(), HasSubstr(dir.path()));
  auto found = ck.require("a");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, ck.find("a"));
}

TEST(Checkpoint, ReportsProgressPerShardAndWhileReadingData) {
  testing::ScratchDir dir;
  write_two_shards(dir);
  write_index(dir, kGoodMap);
  std::vector<CheckpointProgress> events;
  CheckpointOptions options;
  options.progress = [&](const CheckpointProgress& p) { events.push_back(p); };
  options.read_all_data = true;
  auto ck = Checkpoint::open(dir.path(), options);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const uint64_t files = fs::file_size(dir.file(kShard1)) + fs::file_size(dir.file(kShard2));
  // Two header events, then (the shards being small) one data event per shard.
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].phase, CheckpointProgress::Phase::kHeaders);
  EXPECT_EQ(events[0].shards_done, 1u);
  EXPECT_EQ(events[0].tensors_done, 2u);
  EXPECT_EQ(events[0].tensors_total, 4u);
  EXPECT_EQ(events[0].current_file, kShard1);
  EXPECT_EQ(events[1].shards_done, 2u);
  EXPECT_EQ(events[1].bytes_done, files);
  EXPECT_EQ(events[1].bytes_total, files);
  EXPECT_EQ(events[1].tensors_done, 4u);
  EXPECT_EQ(events[2].phase, CheckpointProgress::Phase::kData);
  EXPECT_EQ(events[2].bytes_done, 40u);
  EXPECT_EQ(events[3].bytes_done, 100u);
  EXPECT_EQ(events[3].bytes_total, 100u);
  EXPECT_EQ(events[3].tensors_done, 4u);
  EXPECT_EQ(events[3].shards_done, 2u);
}

TEST(Checkpoint, FollowsSymlinkedShards) {
  // The Hugging Face cache links snapshot files to blobs elsewhere.
  testing::ScratchDir blobs, dir;
  write_shard(blobs.file("blob1"), {{"a", 10}, {"c", 30}});
  write_shard(blobs.file("blob2"), {{"b", 20}, {"d", 40}});
  fs::create_symlink(blobs.file("blob1"), dir.file(kShard1));
  fs::create_symlink(blobs.file("blob2"), dir.file(kShard2));
  write_index(dir, kGoodMap);
  EXPECT_TRUE(Checkpoint::open(dir.path()).ok());
}

TEST(Checkpoint, MissingDirectoryOrFilesIsNotFound) {
  testing::ScratchDir dir;
  auto none = Checkpoint::open(dir.path());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr(dir.path()));
  EXPECT_THAT(none.status().message(), HasSubstr(kIndexFileName));
  auto gone = Checkpoint::open(dir.file("absent"));
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("absent"));
}

TEST(Checkpoint, MissingShardNamesTheShardAndATensor) {
  testing::ScratchDir dir;
  write_two_shards(dir);
  write_index(dir, kGoodMap);
  fs::remove(dir.file(kShard2));
  auto ck = Checkpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(ck.status().message(), HasSubstr(std::string("'") + kShard2 + "' (holds 'b' and 1 more)"));
  EXPECT_THAT(ck.status().message(), HasSubstr(dir.path()));
}

TEST(Checkpoint, TensorMissingFromItsShardIsDataLoss) {
  testing::ScratchDir dir;
  write_two_shards(dir);
  auto map = kGoodMap;
  map["e"] = kShard2;  // the index promises a tensor shard 2 lacks
  write_index(dir, map);
  auto ck = Checkpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(ck.status().message(), HasSubstr(std::string("tensor 'e' is missing from shard ") + kShard2));
}

TEST(Checkpoint, ListsEveryDisagreementBetweenIndexAndShards) {
  testing::ScratchDir dir;
  write_two_shards(dir);
  // "c" is in shard 1 but the index omits it; "d" is placed in the wrong shard; "x" does not exist.
  write_index(dir, {{"a", kShard1}, {"b", kShard2}, {"d", kShard1}, {"x", kShard2}});
  auto ck = Checkpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kDataLoss);
  const std::string& m = ck.status().message();
  EXPECT_THAT(m, HasSubstr("(4 problem(s))"));
  EXPECT_THAT(m, HasSubstr(std::string("tensor 'd' is missing from shard ") + kShard1));
  EXPECT_THAT(m, HasSubstr(std::string("shard ") + kShard1 + " holds tensor 'c' that the index does not place there"));
  EXPECT_THAT(m, HasSubstr(std::string("shard ") + kShard2 + " holds tensor 'd' that the index does not place there"));
  EXPECT_THAT(m, HasSubstr(std::string("tensor 'x' is missing from shard ") + kShard2));
}

TEST(Checkpoint, LongProblemListsAreCut) {
  testing::ScratchDir dir;
  write_shard(dir.file(kShard1), {{"a", 1}});
  std::map<std::string, std::string> map = {{"a", kShard1}};
  for (int i = 0; i < 30; ++i) map["ghost" + std::to_string(100 + i)] = kShard1;
  write_index(dir, map);
  auto ck = Checkpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_THAT(ck.status().message(), HasSubstr("(30 problem(s))"));
  EXPECT_THAT(ck.status().message(), HasSubstr("... and 10 more"));
}

TEST(Checkpoint, RefusesShardPathsOutsideTheDirectory) {
  for (const char* shard : {"../outside.safetensors", "sub/inner.safetensors", "/etc/passwd", "..", ".", ""}) {
    testing::ScratchDir dir;
    // Written by hand: write_index_json itself refuses such names.
    testing::write_text(dir.file(kIndexFileName),
                        std::string(R"({"weight_map":{"evil.weight":")") + shard + "\"}}");
    auto ck = Checkpoint::open(dir.path());
    ASSERT_FALSE(ck.ok()) << shard;
    EXPECT_EQ(ck.status().code(), StatusCode::kDataLoss) << shard;
    EXPECT_THAT(ck.status().message(), HasSubstr(std::string("'") + shard + "' (tensor 'evil.weight')"));
    EXPECT_THAT(ck.status().message(), HasSubstr(kIndexFileName));
  }
}

TEST(Checkpoint, RefusesMalformedIndexes) {
  const std::pair<const char*, const char*> cases[] = {
      {"{\"weight_map\":", "not valid JSON"},
      {"[]", "expected a JSON object"},
      {"{\"metadata\":{}}", "missing the \"weight_map\" object"},
      {"{\"weight_map\":[]}", "missing the \"weight_map\" object"},
      {"{\"weight_map\":{\"a\":3}}", "weight_map entry for tensor 'a' is a JSON number"},
  };
  for (const auto& [text, detail] : cases) {
    testing::ScratchDir dir;
    testing::write_text(dir.file(kIndexFileName), text);
    auto ck = Checkpoint::open(dir.path());
    ASSERT_FALSE(ck.ok()) << text;
    EXPECT_EQ(ck.status().code(), StatusCode::kDataLoss) << text;
    EXPECT_THAT(ck.status().message(), HasSubstr(detail));
    EXPECT_THAT(ck.status().message(), HasSubstr(dir.file(kIndexFileName)));
  }
}

TEST(Checkpoint, RefusesAnOversizedIndex) {
  testing::ScratchDir dir;
  testing::write_text(dir.file(kIndexFileName), "{}");
  fs::resize_file(dir.file(kIndexFileName), 100'000'001);  // sparse: costs no disk
  auto ck = Checkpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(ck.status().message(), HasSubstr("over the 100000000-byte limit"));
}

TEST(Checkpoint, TruncatedShardNamesTheShardAndTheTensor) {
  testing::ScratchDir dir;
  write_two_shards(dir);
  write_index(dir, kGoodMap);
  const auto size = fs::file_size(dir.file(kShard2));
  fs::resize_file(dir.file(kShard2), size - 1);  // the last byte of "d" is gone
  auto ck = Checkpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(ck.status().message(), HasSubstr(dir.file(kShard2)));
  EXPECT_THAT(ck.status().message(), HasSubstr("tensor 'd'"));
  EXPECT_THAT(ck.status().message(), HasSubstr("truncated"));
}

TEST(Checkpoint, WrongDtypeInAShardNamesTheShardAndTheTensor) {
  testing::ScratchDir dir;
  testing::write_bytes(dir.file(kSingleFileName),
                       testing::raw_safetensors(R"({"w":{"dtype":"F8_E4M4","shape":[1],"data_offsets":[0,1]}})",
                                                {0}));
  auto ck = Checkpoint::open(dir.path());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(ck.status().message(), HasSubstr(dir.file(kSingleFileName)));
  EXPECT_THAT(ck.status().message(), HasSubstr("tensor 'w': unknown dtype 'F8_E4M4'"));
}

}  // namespace
}  // namespace cedar::io
