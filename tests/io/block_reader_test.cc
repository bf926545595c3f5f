// BlockReader and SlotCache over a scratch file with known bytes: both backends, direct and
// buffered; the cache's eviction keeps often-used keys, never evicts held ones, and reports a read
// that cannot be satisfied.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "io/block_reader.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io/slot_cache.h"

namespace cedar::io {
namespace {

constexpr size_t kBlock = 8192;  // one key = one 8 KiB block of the file

uint8_t byte_at(uint64_t pos) { return static_cast<uint8_t>((pos * 2654435761u) >> 13); }

class ScratchFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/cedar_block_reader_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::vector<uint8_t> bytes(kBlock * 64 + 100);  // a tail that is not a whole block
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = byte_at(i);
    std::ofstream(path_, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    size_ = bytes.size();
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::string path_;
  size_t size_ = 0;
};

void read_and_check(BlockReader& r, size_t file_size) {
  alignas(4096) static uint8_t buf[3][kBlock];
  // Two whole blocks and the short tail at the end of the file.
  const uint64_t offs[3] = {0, 5 * kBlock, 64 * kBlock};
  for (int i = 0; i < 3; ++i) {
    const uint64_t need = std::min<uint64_t>(kBlock, file_size - offs[i]);
    r.submit({0, offs[i], kBlock, need, buf[i], static_cast<uint64_t>(i)});
  }
  std::vector<ReadCompletion> done(8);
  size_t got = 0;
  while (got < 3) {
    const size_t n = r.reap(std::span<ReadCompletion>(done.data() + got, done.size() - got), true);
    ASSERT_GT(n, 0u);
    got += n;
  }
  for (size_t i = 0; i < got; ++i) EXPECT_EQ(done[i].error, 0) << "read " << done[i].tag;
  for (int i = 0; i < 3; ++i) {
    const uint64_t need = std::min<uint64_t>(kBlock, file_size - offs[i]);
    for (uint64_t j = 0; j < need; ++j) ASSERT_EQ(buf[i][j], byte_at(offs[i] + j)) << "block " << i << " byte " << j;
  }
  EXPECT_EQ(r.bytes_read(), 2 * kBlock + 100);
}

TEST_F(ScratchFile, IoUringDirect) {
  auto r = BlockReader::open({path_}, {true, true, 8, 2});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  read_and_check(**r, size_);
}

TEST_F(ScratchFile, PreadPoolBuffered) {
  auto r = BlockReader::open({path_}, {false, false, 8, 2});
  ASSERT_TRUE(r.ok());
  EXPECT_STREQ((*r)->backend(), "pread pool");
  EXPECT_FALSE((*r)->direct(0));
  read_and_check(**r, size_);
}

TEST_F(ScratchFile, MissingFileIsAnIoErrorNamingIt) {
  auto r = BlockReader::open({path_ + ".absent"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(".absent"), std::string::npos);
}

class BlockFiller : public SlotFiller {
 public:
  size_t describe(uint64_t key, uint8_t* slot, ReadRequest* out, size_t) override {
    out[0] = {0, key * kBlock, kBlock, kBlock, slot, 0};
    return 1;
  }
};

TEST_F(ScratchFile, SlotCacheServesEvictsAndKeepsHeldSlots) {
  auto r = BlockReader::open({path_});
  ASSERT_TRUE(r.ok());
  BlockFiller filler;
  auto c = SlotCache::create(r->get(), &filler, {kBlock, 4096, 4, true, "test cache"});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  SlotCache& cache = **c;
  // Key 0 is used often; keys 1.. stream past it. It must survive, and a held key must too.
  const int held = cache.fetch(63, SlotCache::Mode::kHold);
  for (uint64_t k = 1; k < 40; ++k) {
    const int s0 = cache.fetch(0, SlotCache::Mode::kHold);
    const uint8_t* p0 = cache.wait(s0);
    ASSERT_EQ(p0[17], byte_at(17));
    cache.release(s0);
    const int s = cache.fetch(k, SlotCache::Mode::kHold);
    const uint8_t* p = cache.wait(s);
    ASSERT_EQ(p[100], byte_at(k * kBlock + 100)) << "key " << k;
    cache.release(s);
  }
  EXPECT_TRUE(cache.resident(0));
  EXPECT_TRUE(cache.resident(63));
  EXPECT_EQ(cache.wait(held)[5], byte_at(63 * kBlock + 5));
  cache.release(held);
  EXPECT_EQ(cache.stats().misses, 1u + 1u + 39u);  // 63, 0 once, then every streaming key
  EXPECT_EQ(cache.stats().hits, 38u);
  EXPECT_EQ(cache.stats().bytes_read, 41u * kBlock);
  EXPECT_TRUE(cache.error().ok());
}

TEST_F(ScratchFile, SlotCacheReportsAReadPastTheEnd) {
  auto r = BlockReader::open({path_});
  ASSERT_TRUE(r.ok());
  BlockFiller filler;
  auto c = SlotCache::create(r->get(), &filler, {kBlock, 4096, 2, true, "test cache"});
  ASSERT_TRUE(c.ok());
  const int s = (*c)->fetch(100, SlotCache::Mode::kHold);  // block 100 lies past the end of the file
  (*c)->wait(s);
  ASSERT_FALSE((*c)->error().ok());
  EXPECT_NE((*c)->error().message().find(path_), std::string::npos) << (*c)->error().message();
}

}  // namespace
}  // namespace cedar::io

namespace cedar::io {
namespace {

// A filtered open maps only the kept tensors; their views hold the same bytes as a whole-file open.
TEST(SafetensorsFilter, MapsOnlyKeptTensors) {
  const std::string path = ::testing::TempDir() + "/cedar_filter_" + std::to_string(::getpid()) + ".safetensors";
  SafetensorsWriter w;
  std::vector<uint8_t> a(10000), b(300000), c(5000), d(7);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<uint8_t>(i * 13 + 1);
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<uint8_t>(200 + i);
  ASSERT_TRUE(w.add("a", Dtype::kU8, {10000}, a).ok());
  ASSERT_TRUE(w.add("big.skip", Dtype::kU8, {300000}, b).ok());
  ASSERT_TRUE(w.add("c", Dtype::kU8, {5000}, c).ok());
  ASSERT_TRUE(w.add("d", Dtype::kU8, {7}, d).ok());
  ASSERT_TRUE(w.write(path).ok());
  auto whole = SafetensorsFile::open(path);
  auto part = SafetensorsFile::open(path, [](std::string_view n) { return !n.ends_with(".skip"); });
  ASSERT_TRUE(whole.ok() && part.ok()) << part.status().to_string();
  EXPECT_EQ(part->file_size(), whole->file_size());
  EXPECT_EQ(part->mapping().data(), nullptr);
  EXPECT_EQ(part->find("big.skip")->data, nullptr);
  EXPECT_EQ(part->find("big.skip")->file_offset, whole->find("big.skip")->file_offset);
  for (const char* n : {"a", "c", "d"}) {
    const TensorView* p = part->find(n);
    const TensorView* q = whole->find(n);
    ASSERT_NE(p->data, nullptr) << n;
    EXPECT_EQ(0, std::memcmp(p->data, q->data, q->nbytes)) << n;
    part->prefetch(*p);  // a hint on a window: must not fault or crash
  }
  part->prefetch(*part->find("big.skip"));  // unmapped: ignored
  std::filesystem::remove(path);
}

TEST(SafetensorsFilter, TruncatedFileIsStillReported) {
  const std::string path = ::testing::TempDir() + "/cedar_filter_trunc_" + std::to_string(::getpid());
  std::ofstream(path, std::ios::binary) << std::string("\x10\x00\x00\x00\x00\x00\x00\x00{\"a\"", 12);
  auto f = SafetensorsFile::open(path, [](std::string_view) { return true; });
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().message();
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace cedar::io
