// TailCache: partial-block prefix entries in memory and on disk: exact-prefix keys, longest match,
// persistence across a "restart", damage, eviction and a full disk.
#include "kv/tail_cache.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "kv_test_util.h"

namespace cedar::kv {
namespace {

using testing::fresh_temp_dir;
using testing::iota_tokens;
using testing::tiny_geometry;

namespace fs = std::filesystem;

// A payload that is a function of the tokens, so a mix-up shows.
std::vector<uint8_t> payload_for(const CacheGeometry& g, std::span<const int32_t> tokens, int64_t start, int64_t end) {
  std::vector<uint8_t> p(TailCache::payload_bytes(g, end - start));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(tokens[static_cast<size_t>(end - 1)] * 31 + i);
  return p;
}

std::vector<std::string> files_in(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().string().ends_with(suffix)) out.push_back(e.path().string());
  return out;
}

TEST(TailCache, PayloadLayoutFollowsOwners) {
  const CacheGeometry g = tiny_geometry(8);  // owners: ratio 2 (36 + 17 bytes), ratio 1 (36 + 17 bytes)
  ASSERT_EQ(g.owners.size(), 2u);
  // 5 tokens: 2 complete ratio-2 groups, 5 ratio-1 entries.
  EXPECT_EQ(TailCache::payload_bytes(g, 5), 2u * (36 + 17) + 5u * (36 + 17));
  EXPECT_EQ(TailCache::main_offset(g, 5, 0), 0u);
  EXPECT_EQ(TailCache::index_offset(g, 5, 0), 2u * 36);
  EXPECT_EQ(TailCache::main_offset(g, 5, 1), 2u * (36 + 17));
  EXPECT_EQ(TailCache::index_offset(g, 5, 1), 2u * (36 + 17) + 5u * 36);
}

TEST(TailCache, LongestTailAfterTheExactPrefix) {
  const CacheGeometry g = tiny_geometry(8);
  auto c = TailCache::open(g);
  ASSERT_TRUE(c.ok());
  const auto a = iota_tokens(20, 100);  // prefix of 16 (2 blocks) then tokens 116..119
  ASSERT_TRUE((*c)->save(a, 16, 18, payload_for(g, a, 16, 18)).ok());
  ASSERT_TRUE((*c)->save(a, 16, 19, payload_for(g, a, 16, 19)).ok());
  std::vector<uint8_t> got;
  EXPECT_EQ((*c)->lookup(a, 16, 10, &got), 3);
  EXPECT_EQ(got, payload_for(g, a, 16, 19));
  EXPECT_EQ((*c)->lookup(a, 16, 2, &got), 2);  // max_tokens caps the match
  EXPECT_EQ(got, payload_for(g, a, 16, 18));
  // Another prefix in front of the same tail tokens: no match.
  auto b = a;
  b[3] = 7;
  EXPECT_EQ((*c)->lookup(b, 16, 10, &got), 0);
  // A tail that diverges inside: only the shorter one fits.
  auto d = a;
  d[18] = 5;
  EXPECT_EQ((*c)->lookup(d, 16, 10, &got), 2);
  // Misuse is refused.
  EXPECT_FALSE((*c)->save(a, 15, 17, payload_for(g, a, 15, 17)).ok());  // not on a block boundary
  EXPECT_FALSE((*c)->save(a, 8, 16, payload_for(g, a, 8, 16)).ok());    // a whole block
  EXPECT_FALSE((*c)->save(a, 16, 18, std::vector<uint8_t>(3)).ok());    // wrong payload size
  EXPECT_EQ((*c)->stats().saved, 2u);
}

TEST(TailCache, SurvivesARestartAndDropsDamagedFiles) {
  const CacheGeometry g = tiny_geometry(8);
  const std::string dir = fresh_temp_dir("tails");
  const auto a = iota_tokens(13, 5), b = iota_tokens(21, 900);
  {
    TailCacheOptions o;
    o.dir = dir;
    auto c = TailCache::open(g, o);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE((*c)->save(a, 8, 13, payload_for(g, a, 8, 13)).ok());
    ASSERT_TRUE((*c)->save(b, 16, 21, payload_for(g, b, 16, 21)).ok());
    ASSERT_TRUE((*c)->save(b, 16, 21, payload_for(g, b, 16, 21)).ok());  // already there
    EXPECT_EQ((*c)->stats().disk_tails, 2u);
  }
  ASSERT_EQ(files_in(dir, ".kvt").size(), 2u);
  // Damage b's file (one payload byte), leave a .part behind, and add a file of another layout.
  std::string b_file;
  for (const std::string& f : files_in(dir, ".kvt")) {
    std::ifstream in(f, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    int32_t first;
    std::memcpy(&first, bytes.data() + kTailFileHeaderBytes, 4);
    if (first == b[16]) b_file = f;
  }
  ASSERT_FALSE(b_file.empty());
  {
    std::fstream f(b_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x55');
  }
  std::ofstream(dir + "/0123.kvt.part") << "half";
  TailCacheOptions o;
  o.dir = dir;
  ::testing::internal::CaptureStderr();
  auto c = TailCache::open(g, o);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(c.ok());
  const TailCacheStats st = (*c)->stats();
  EXPECT_EQ(st.disk_tails, 1u);
  EXPECT_EQ(st.damaged, 1u);
  EXPECT_EQ(st.temp_removed, 1u);
  EXPECT_NE(log.find("body checksum mismatch"), std::string::npos) << log;
  std::vector<uint8_t> got;
  EXPECT_EQ((*c)->lookup(a, 8, 100, &got), 5);  // read back from disk
  EXPECT_EQ(got, payload_for(g, a, 8, 13));
  EXPECT_EQ((*c)->stats().hits_disk, 1u);
  EXPECT_EQ((*c)->lookup(b, 16, 100, &got), 0);
  c->reset();
  // A cache directory belongs to one model and layout: another one never uses these files (like
  // block files, they are removed as foreign).
  ::testing::internal::CaptureStderr();
  auto foreign = TailCache::open(tiny_geometry(8, 99), o);
  const std::string log2 = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ((*foreign)->stats().disk_tails, 0u);
  EXPECT_NE(log2.find("another model"), std::string::npos) << log2;
}

TEST(TailCache, KeepsTheMostRecentlyUsed) {
  const CacheGeometry g = tiny_geometry(8);
  const std::string dir = fresh_temp_dir("tails_lru");
  TailCacheOptions o;
  o.dir = dir;
  o.memory_tails = 2;
  o.disk_tails = 2;
  testing::NoSyncFileSystem nosync;
  o.fs = &nosync;
  auto c = TailCache::open(g, o);
  ASSERT_TRUE(c.ok());
  const auto x = iota_tokens(5, 1), y = iota_tokens(5, 50), z = iota_tokens(5, 90);
  std::vector<uint8_t> got;
  ASSERT_TRUE((*c)->save(x, 0, 5, payload_for(g, x, 0, 5)).ok());
  ASSERT_TRUE((*c)->save(y, 0, 5, payload_for(g, y, 0, 5)).ok());
  EXPECT_EQ((*c)->lookup(x, 0, 5, &got), 5);  // x is now more recent than y
  ASSERT_TRUE((*c)->save(z, 0, 5, payload_for(g, z, 0, 5)).ok());
  EXPECT_EQ((*c)->lookup(y, 0, 5, &got), 0);
  EXPECT_EQ((*c)->lookup(x, 0, 5, &got), 5);
  EXPECT_EQ((*c)->lookup(z, 0, 5, &got), 5);
  const auto files = files_in(dir, ".kvt");
  EXPECT_EQ(files.size(), 2u);
  uint64_t on_disk = 0;
  for (const std::string& f : files) on_disk += fs::file_size(f);
  EXPECT_EQ((*c)->stats().disk_bytes, on_disk);
}

// Writes fail with ENOSPC: one warning, nothing half-written, memory tails still work.
class NoSpace : public FileSystem {
 public:
  ssize_t write(int, const void*, size_t) override {
    errno = ENOSPC;
    return -1;
  }
};

TEST(TailCache, FullDiskTurnsPersistenceOff) {
  const CacheGeometry g = tiny_geometry(8);
  const std::string dir = fresh_temp_dir("tails_full");
  NoSpace full;
  TailCacheOptions o;
  o.dir = dir;
  o.fs = &full;
  auto c = TailCache::open(g, o);
  ASSERT_TRUE(c.ok());
  const auto x = iota_tokens(5, 1), y = iota_tokens(6, 70);
  ::testing::internal::CaptureStderr();
  EXPECT_TRUE((*c)->save(x, 0, 5, payload_for(g, x, 0, 5)).ok());
  EXPECT_TRUE((*c)->save(y, 0, 6, payload_for(g, y, 0, 6)).ok());
  const std::string log = ::testing::internal::GetCapturedStderr();
  const TailCacheStats st = (*c)->stats();
  EXPECT_TRUE(st.persistence_disabled);
  EXPECT_EQ(st.write_failures, 1u);
  EXPECT_EQ(st.disk_tails, 0u);
  EXPECT_TRUE(files_in(dir, ".part").empty());
  EXPECT_NE(log.find("persistence is OFF"), std::string::npos) << log;
  std::vector<uint8_t> got;
  EXPECT_EQ((*c)->lookup(y, 0, 10, &got), 6);
  EXPECT_EQ(got, payload_for(g, y, 0, 6));
}

}  // namespace
}  // namespace cedar::kv
