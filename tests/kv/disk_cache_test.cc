// Durable prefix cache: restart survival, damage detection (each header field, payload, truncation,
// foreign/stale/orphaned/leftover files), a full disk (injected ENOSPC), kill -9 mid-write (a forked
// child), the directory lock, and the eviction budget (property test on real files).
#include "kv/disk_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "kv/kv_cache.h"
#include "kv_test_util.h"

namespace cedar::kv {
namespace {

namespace fs = std::filesystem;
using testing::expect_content;
using testing::fake_forward;
using testing::fresh_temp_dir;
using testing::iota_tokens;
using testing::NoSyncFileSystem;
using testing::tiny_geometry;

// A model instance with a disk cache: what one process has.
struct Instance {
  std::unique_ptr<DiskPrefixCache> disk;
  std::unique_ptr<KvCache> cache;
  ChainHashFn hash = xxh3_chain_hash;

  static Instance open(const std::string& dir, DiskCacheOptions opt = {}, uint64_t fingerprint = 7,
                       ChainHashFn hash = xxh3_chain_hash) {
    Instance in;
    const CacheGeometry g = tiny_geometry(4, fingerprint);
    auto d = DiskPrefixCache::open(dir, g, opt);
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    in.disk = std::move(d).value();
    KvCacheOptions o;
    o.capacity_blocks = 64;
    o.disk = in.disk.get();
    o.hash = hash;
    in.cache = KvCache::create(g, o).value();
    in.hash = hash;
    return in;
  }
  // Runs a request and commits it; returns the tokens reused from the caches.
  int64_t run(std::span<const int32_t> prompt) {
    Sequence* s = cache->new_sequence().value();
    const int64_t h = cache->attach_prefix(*s, prompt, static_cast<int64_t>(prompt.size()) - 1).value();
    EXPECT_TRUE(cache->append(*s, prompt.subspan(static_cast<size_t>(h))).ok());
    fake_forward(*s, h);
    expect_content(*s);
    EXPECT_TRUE(cache->commit(*s).ok());
    cache->release(s);
    return h;
  }
  size_t stored(std::span<const int32_t> tokens) {
    const auto& g = cache->geometry();
    const auto h = chain_hashes(tokens, g.block_tokens, tokens.size() / g.block_tokens,
                                chain_root_hash(g.layout_fingerprint()), hash);
    return disk->stored_blocks(tokens, h);
  }
  void close() {
    cache.reset();
    disk.reset();
  }
};

std::vector<fs::path> files_with(const std::string& dir, const std::string& ext) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ext) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The block file holding `depth` of the only stored prefix (reads the depth field of each header).
fs::path file_at_depth(const std::string& dir, uint32_t depth) {
  for (const auto& p : files_with(dir, ".kvb")) {
    std::ifstream f(p, std::ios::binary);
    char h[128];
    f.read(h, 128);
    uint32_t d;
    std::memcpy(&d, h + 48, 4);
    if (d == depth) return p;
  }
  return {};
}

void flip_byte(const fs::path& p, size_t offset, uint8_t mask) {
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST(DiskPrefixCache, SurvivesARestart) {
  const std::string dir = fresh_temp_dir("restart");
  const auto prompt = iota_tokens(14, 1000);  // 3 full blocks
  {
    Instance a = Instance::open(dir);
    EXPECT_EQ(a.run(prompt), 0);
    EXPECT_EQ(a.disk->stats().saved_blocks, 3u);
    EXPECT_EQ(files_with(dir, ".kvb").size(), 3u);
    for (const auto& p : files_with(dir, ".kvb")) EXPECT_EQ(fs::file_size(p), a.disk->block_file_bytes());
    EXPECT_TRUE(files_with(dir, ".part").empty());
  }
  Instance b = Instance::open(dir);
  EXPECT_EQ(b.disk->stats().files, 3u);
  Sequence* s = b.cache->new_sequence().value();
  ASSERT_EQ(b.cache->attach_prefix(*s, prompt, 13).value(), 12);
  EXPECT_EQ(b.cache->stats().reused_tokens_disk, 12u);
  expect_content(*s);  // the reloaded KV is byte-identical
  // The Engram history of the last reused block came back too.
  EXPECT_EQ(std::vector<int64_t>(s->engram_history().begin(), s->engram_history().end()),
            (std::vector<int64_t>{prompt[11], prompt[10], prompt[9]}));
  // A second request is served from memory (the loaded blocks went into the index).
  Sequence* t = b.cache->new_sequence().value();
  ASSERT_EQ(b.cache->attach_prefix(*t, prompt, 13).value(), 12);
  EXPECT_EQ(b.cache->stats().reused_tokens_memory, 12u);
  EXPECT_EQ(b.disk->stats().loaded_blocks, 3u);
}

TEST(DiskPrefixCache, ExtendsAPartialMemoryHitFromDiskAndSharesDuplicates) {
  const std::string dir = fresh_temp_dir("extend");
  const auto longp = iota_tokens(17, 1);
  {
    Instance a = Instance::open(dir);
    a.run(longp);
  }
  Instance b = Instance::open(dir);
  const std::vector<int32_t> shortp(longp.begin(), longp.begin() + 9);
  EXPECT_EQ(b.run(shortp), 8);  // 2 blocks from disk
  EXPECT_EQ(b.run(longp), 16);  // 2 from memory, 2 more from disk
  EXPECT_EQ(b.cache->stats().reused_tokens_memory, 8u);
  EXPECT_EQ(b.cache->stats().reused_tokens_disk, 16u);
  EXPECT_EQ(b.disk->stats().saved_blocks, 0u);  // nothing new to write
  EXPECT_GT(b.disk->stats().present_blocks, 0u);
}

TEST(DiskPrefixCache, ForcedHashCollisionsOnDiskNeverConfuseTwoPrefixes) {
  // Every block of every prefix gets chain hash 5: files differ only by uid, the parent link and the
  // tokens they hold.
  const ChainHashFn constant = [](uint64_t, std::span<const int32_t>) -> uint64_t { return 5; };
  const std::string dir = fresh_temp_dir("collide");
  const auto a = iota_tokens(9, 1);
  auto b = a;
  b[1] = 42;  // different first block, same second block
  auto c = a;
  c[5] = 43;  // same first block, different second block
  {
    Instance x = Instance::open(dir, {}, 7, constant);
    x.run(a);
    x.run(b);
  }
  Instance y = Instance::open(dir, {}, 7, constant);
  EXPECT_EQ(y.disk->stats().files, 4u);
  EXPECT_EQ(y.stored(a), 2u);
  EXPECT_EQ(y.stored(b), 2u);
  EXPECT_EQ(y.stored(c), 1u);
  EXPECT_EQ(y.run(b), 8);  // expect_content inside run() checks the reloaded KV is b's own
  EXPECT_EQ(y.run(c), 4);
  EXPECT_EQ(y.run(a), 8);
  EXPECT_GT(y.disk->stats().hash_collisions, 0u);
}

TEST(DiskPrefixCache, DamagedHeaderFieldsAreDetectedRemovedAndNeverUsed) {
  const auto prompt = iota_tokens(13, 50);  // blocks at depth 0, 1, 2
  NoSyncFileSystem no_sync;
  DiskCacheOptions opt;
  opt.fs = &no_sync;
  for (const BlockFileField& field : block_file_fields()) {
    const std::string dir = fresh_temp_dir("field");
    {
      Instance a = Instance::open(dir, opt);
      a.run(prompt);
    }
    flip_byte(file_at_depth(dir, 1), field.offset + field.size / 2, 0x04);
    Instance b = Instance::open(dir);
    const DiskCacheStats st = b.disk->stats();
    const uint64_t detected = st.corrupt + st.foreign + st.stale + st.truncated;
    EXPECT_EQ(detected, 1u) << field.name;
    if (std::string(field.name) == "format_version") {
      EXPECT_EQ(st.stale, 1u);
    }
    if (std::string(field.name) == "magic") {
      EXPECT_EQ(st.foreign, 1u);
    }
    EXPECT_EQ(st.orphaned, 1u) << field.name;  // depth 2 hung off the damaged file
    EXPECT_EQ(files_with(dir, ".kvb").size(), 1u) << field.name;
    Sequence* s = b.cache->new_sequence().value();
    EXPECT_EQ(b.cache->attach_prefix(*s, prompt, 12).value(), 4) << field.name;
    expect_content(*s);
  }
}

TEST(DiskPrefixCache, DamagedPayloadIsDetectedOnLoadRemovedAndNeverUsed) {
  const std::string dir = fresh_temp_dir("payload");
  const auto prompt = iota_tokens(13, 50);
  {
    Instance a = Instance::open(dir);
    a.run(prompt);
  }
  const fs::path victim = file_at_depth(dir, 1);
  flip_byte(victim, fs::file_size(victim) - 7, 0x01);  // a KV byte
  ::testing::internal::CaptureStderr();
  Instance b = Instance::open(dir);
  EXPECT_EQ(b.disk->stats().corrupt, 0u);  // the header is fine: found only when the body is read
  Sequence* s = b.cache->new_sequence().value();
  EXPECT_EQ(b.cache->attach_prefix(*s, prompt, 12).value(), 4);  // block 0 only
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("body checksum mismatch"), std::string::npos) << log;
  expect_content(*s);
  EXPECT_EQ(b.disk->stats().corrupt, 1u);
  EXPECT_EQ(b.disk->stats().orphaned, 1u);
  EXPECT_FALSE(fs::exists(victim));
  // The prefix is recomputed and stored again.
  b.cache->release(s);
  EXPECT_EQ(b.run(prompt), 4);
  EXPECT_EQ(b.stored(prompt), 3u);
}

TEST(DiskPrefixCache, TruncatedForeignStaleOrphanAndLeftoverFiles) {
  const std::string dir = fresh_temp_dir("misc");
  const auto p1 = iota_tokens(9, 1), p2 = iota_tokens(9, 500), p3 = iota_tokens(5, 900);
  {
    Instance a = Instance::open(dir);
    a.run(p1);
    a.run(p2);
  }
  {
    Instance other = Instance::open(dir, {}, /*fingerprint=*/8);  // another model in the same directory
    EXPECT_EQ(other.disk->stats().foreign, 4u);                   // it removes ours...
    other.run(p3);                                                // ...and leaves one of its own
  }
  // p1 / p2 are gone (the other model removed them); rebuild and damage them in other ways.
  Instance a = Instance::open(dir);
  EXPECT_EQ(a.disk->stats().foreign, 1u);
  a.run(p1);
  a.run(p2);
  a.close();
  // Truncate one depth-1 file; delete the depth-0 file of the other prefix, so its depth-1 file is
  // an orphan; leave an interrupted write and a stranger's file behind.
  struct Info {
    fs::path path;
    uint64_t uid, parent;
    uint32_t depth;
  };
  std::vector<Info> infos;
  for (const auto& p : files_with(dir, ".kvb")) {
    std::ifstream f(p, std::ios::binary);
    char h[128];
    f.read(h, 128);
    Info i{p, 0, 0, 0};
    std::memcpy(&i.uid, h + 32, 8);
    std::memcpy(&i.parent, h + 40, 8);
    std::memcpy(&i.depth, h + 48, 4);
    infos.push_back(i);
  }
  ASSERT_EQ(infos.size(), 4u);
  std::sort(infos.begin(), infos.end(), [](const Info& a, const Info& b) { return a.depth < b.depth; });
  const Info& cut = infos[2];
  const Info& other_root = infos[0].uid == cut.parent ? infos[1] : infos[0];
  fs::resize_file(cut.path, fs::file_size(cut.path) - 3);
  fs::remove(other_root.path);
  std::ofstream(dir + "/00000000000000aa.part") << "half a block";
  std::ofstream(dir + "/notes.txt") << "not a cache file";
  Instance b = Instance::open(dir);
  const DiskCacheStats st = b.disk->stats();
  EXPECT_EQ(st.temp_removed, 1u);
  EXPECT_EQ(st.truncated, 1u);
  EXPECT_EQ(st.orphaned, 1u);
  EXPECT_FALSE(fs::exists(dir + "/00000000000000aa.part"));
  EXPECT_TRUE(fs::exists(dir + "/notes.txt"));  // not ours: left alone
  EXPECT_EQ(st.files, 1u);  // the root of the truncated file's prefix
  EXPECT_EQ(b.stored(p1) + b.stored(p2), 1u);
}

// Writes succeed until `budget` bytes, then fail with `err` (ENOSPC: the disk is full).
class FullDisk : public FileSystem {
 public:
  FullDisk(int64_t budget, int err) : left_(budget), err_(err) {}
  ssize_t write(int fd, const void* data, size_t n) override {
    if (left_ <= 0) {
      errno = err_;
      return -1;
    }
    const ssize_t w = ::write(fd, data, std::min<size_t>(n, static_cast<size_t>(left_)));
    if (w > 0) left_ -= w;
    return w;
  }
  int64_t left_;
  int err_;
};

TEST(DiskPrefixCache, FullDiskGivesOneWarningAndNoPersistence) {
  const std::string dir = fresh_temp_dir("full");
  const CacheGeometry g = tiny_geometry(4);
  const uint64_t file_bytes = kBlockFileHeaderBytes + 16 + g.boundary_state_bytes + g.block_bytes;
  FullDisk full(static_cast<int64_t>(file_bytes + file_bytes / 2), ENOSPC);  // 1.5 files fit
  DiskCacheOptions opt;
  opt.fs = &full;
  ::testing::internal::CaptureStderr();
  {
    Instance a = Instance::open(dir, opt);
    a.run(iota_tokens(13, 1));  // writes block 0, fails inside block 1
    a.run(iota_tokens(13, 300));
    a.run(iota_tokens(13, 600));
    const DiskCacheStats st = a.disk->stats();
    EXPECT_TRUE(st.persistence_disabled);
    EXPECT_EQ(st.saved_blocks, 1u);
    EXPECT_EQ(st.write_failures, 1u);
    EXPECT_EQ(st.skipped_saves, 2u);
    EXPECT_TRUE(files_with(dir, ".part").empty());  // the partial file was removed
    // Loads keep working.
    EXPECT_EQ(a.stored(iota_tokens(13, 1)), 1u);
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  size_t warnings = 0;
  for (size_t at = log.find("persistence is OFF"); at != std::string::npos; at = log.find("persistence is OFF", at + 1))
    ++warnings;
  EXPECT_EQ(warnings, 1u) << log;
  EXPECT_NE(log.find("The disk is full"), std::string::npos) << log;
  // After a restart with space again, the complete file is still good.
  Instance b = Instance::open(dir);
  EXPECT_EQ(b.disk->stats().files, 1u);
  EXPECT_EQ(b.run(iota_tokens(13, 1)), 4);
}

// Any other write error (fsync EIO here) degrades the same way.
class FailingSync : public FileSystem {
 public:
  int fsync(int) override {
    errno = EIO;
    return -1;
  }
};

TEST(DiskPrefixCache, SyncErrorDegradesLikeAFullDisk) {
  const std::string dir = fresh_temp_dir("eio");
  FailingSync failing;
  DiskCacheOptions opt;
  opt.fs = &failing;
  ::testing::internal::CaptureStderr();
  Instance a = Instance::open(dir, opt);
  a.run(iota_tokens(9, 1));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(a.disk->stats().persistence_disabled);
  EXPECT_EQ(a.disk->stats().files, 0u);
  EXPECT_TRUE(files_with(dir, ".part").empty());
  EXPECT_TRUE(files_with(dir, ".kvb").empty());
  EXPECT_NE(log.find("Input/output error"), std::string::npos) << log;
}

// Writes half of the first block file, tells the parent, and waits to be killed.
class StallMidWrite : public FileSystem {
 public:
  explicit StallMidWrite(int notify_fd) : notify_fd_(notify_fd) {}
  ssize_t write(int fd, const void* data, size_t n) override {
    const ssize_t w = ::write(fd, data, n / 2);
    ::fsync(fd);
    const char c = 'x';
    (void)!::write(notify_fd_, &c, 1);
    for (;;) ::pause();
    return w;
  }
  int notify_fd_;
};

TEST(DiskPrefixCache, KillNineDuringAWriteNeverLeavesAUsableFile) {
  const std::string dir = fresh_temp_dir("kill9");
  const auto done = iota_tokens(9, 1);    // persisted before the crash
  const auto doomed = iota_tokens(9, 77); // being written when the process dies
  {
    Instance a = Instance::open(dir);
    a.run(done);
  }
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    StallMidWrite stall(pipe_fds[1]);
    DiskCacheOptions opt;
    opt.fs = &stall;
    Instance c = Instance::open(dir, opt);
    c.run(doomed);
    ::_exit(3);  // not reached: the parent kills us inside the write
  }
  ::close(pipe_fds[1]);
  char c = 0;
  ASSERT_EQ(::read(pipe_fds[0], &c, 1), 1) << "child never reached the write";
  ::close(pipe_fds[0]);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  ASSERT_EQ(files_with(dir, ".part").size(), 1u);  // the partial write is there...

  Instance b = Instance::open(dir);  // ...and the lock died with the child
  EXPECT_EQ(b.disk->stats().temp_removed, 1u);
  EXPECT_TRUE(files_with(dir, ".part").empty());
  EXPECT_EQ(b.stored(doomed), 0u);  // never used
  EXPECT_EQ(b.stored(done), 2u);
  EXPECT_EQ(b.run(doomed), 0);
  EXPECT_EQ(b.stored(doomed), 2u);
}

TEST(DiskPrefixCache, OneProcessPerDirectory) {
  const std::string dir = fresh_temp_dir("lock");
  Instance a = Instance::open(dir);
  auto second = DiskPrefixCache::open(dir, tiny_geometry(4));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use by another cedar process"), std::string::npos);
  a.close();
  EXPECT_TRUE(DiskPrefixCache::open(dir, tiny_geometry(4)).ok());
  // Missing parents are created; a path that is a file is a clear error, not a crash.
  EXPECT_TRUE(DiskPrefixCache::open(dir + "/nested/deeper", tiny_geometry(4)).ok());
  std::ofstream(dir + "/plain_file") << "x";
  auto bad = DiskPrefixCache::open(dir + "/plain_file", tiny_geometry(4));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("plain_file"), std::string::npos) << bad.status().to_string();
}

TEST(DiskPrefixCache, UseOrderSurvivesARestart) {
  const std::string dir = fresh_temp_dir("lru");
  const CacheGeometry g = tiny_geometry(4);
  const uint64_t file_bytes = kBlockFileHeaderBytes + 16 + g.boundary_state_bytes + g.block_bytes;
  DiskCacheOptions opt;
  opt.budget_bytes = 4 * file_bytes;
  const auto a = iota_tokens(9, 1), b = iota_tokens(9, 100), c = iota_tokens(9, 200);
  {
    Instance x = Instance::open(dir, opt);
    x.run(a);
    x.run(b);
  }
  {
    Instance y = Instance::open(dir, opt);
    y.run(a);  // a is now the most recent, b the oldest
  }
  Instance z = Instance::open(dir, opt);
  z.run(c);  // needs 2 files of room: b goes
  EXPECT_EQ(z.stored(a), 2u);
  EXPECT_EQ(z.stored(b), 0u);
  EXPECT_EQ(z.stored(c), 2u);
  EXPECT_EQ(z.disk->stats().evicted, 2u);
  EXPECT_LE(z.disk->stats().bytes, opt.budget_bytes);
  // Lowering the budget below what is stored evicts at the next open.
  z.close();
  opt.budget_bytes = 2 * file_bytes;
  Instance w = Instance::open(dir, opt);
  EXPECT_EQ(w.disk->stats().files, 2u);
  EXPECT_EQ(w.stored(c), 2u);
}

// The no-starvation guarantee (prefix_lru.h) on the real disk cache: random requests over shared
// prefixes of 1..7 blocks with a budget of 3..8 files; a prefix stays stored while the distinct blocks
// used since its last complete use fit in the budget.
TEST(DiskPrefixCache, EvictionPropertyOnRealFiles) {
  const CacheGeometry g = tiny_geometry(4);
  const uint64_t file_bytes = kBlockFileHeaderBytes + 16 + g.boundary_state_bytes + g.block_bytes;
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    std::mt19937 rng(seed);
    const uint64_t budget_files = 3 + seed * 2;
    DiskCacheOptions opt;
    opt.budget_bytes = budget_files * file_bytes;
    NoSyncFileSystem no_sync;  // durability is tested elsewhere; this one writes hundreds of files
    opt.fs = &no_sync;
    const std::string dir = fresh_temp_dir("evict_prop");
    Instance in = Instance::open(dir, opt);
    // Prompts: random paths over a 2-token alphabet per block, so prefixes share blocks.
    std::map<std::vector<int32_t>, size_t> last_complete;  // prompt (whole blocks) -> op index
    std::vector<std::set<std::vector<int32_t>>> touched;   // per op: block keys (prefix up to the block)
    for (int op = 0; op < 60; ++op) {
      const int blocks = 1 + static_cast<int>(rng() % 7);
      std::vector<int32_t> prompt;
      for (int b = 0; b < blocks; ++b) {
        const int32_t v = static_cast<int32_t>(rng() % 2);
        for (int t = 0; t < 4; ++t) prompt.push_back(v);
      }
      prompt.push_back(9);  // one token past the last block, for the model
      in.run(prompt);
      const std::vector<int32_t> whole(prompt.begin(), prompt.end() - 1);
      const size_t stored = in.stored(whole);
      std::set<std::vector<int32_t>> keys;
      for (size_t b = 1; b <= stored; ++b) keys.insert(std::vector<int32_t>(whole.begin(), whole.begin() + 4 * b));
      touched.push_back(keys);
      if (stored == static_cast<size_t>(blocks)) last_complete[whole] = touched.size() - 1;
      ASSERT_LE(in.disk->stats().bytes, opt.budget_bytes);
      for (const auto& [p, at] : last_complete) {
        std::set<std::vector<int32_t>> since;
        for (size_t i = at; i < touched.size(); ++i) since.insert(touched[i].begin(), touched[i].end());
        if (since.size() <= budget_files) {
          ASSERT_EQ(in.stored(p), p.size() / 4) << "seed " << seed << " op " << op;
        }
      }
    }
    EXPECT_GT(in.disk->stats().evicted, 0u) << "the workload must overflow the budget";
  }
}

}  // namespace
}  // namespace cedar::kv
