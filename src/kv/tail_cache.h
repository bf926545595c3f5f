// TailCache: prefix-cache entries shorter than a block.
//
// The block cache (KvCache, DiskPrefixCache) stores whole blocks only, so a prefix that ends inside a
// block loses its last partial block: a conversation whose next turn re-renders the previous answer
// differently from the generated tokens (a random test model, a non-canonical tokenization, dropped
// reasoning) would find only the whole blocks of its previous prompt. A tail records the tokens and
// global KV entries of such a partial block, keyed by the exact prefix in front of it, so a resume
// can restore the previous prompt to its last token. Tails are leaves: nothing is chained after them.
//
// Key: XXH3-128 of the prefix tokens [0, start) (seeded with the cache layout fingerprint) and start,
// a multiple of block_tokens; the tail's own tokens are compared in full before use.
// Payload, per KV owner o in geometry order: (n / ratio_o) main entries, then as many index keys
// (the entries of groups that complete inside the tail; a group still pending is rebuilt by replay).
//
// Memory: the most recently used `memory_tails` tails. Disk (optional, a directory the caller owns and
// locks): one file per tail, <digest>-<tail hash>.kvt, written as a .part file, fsynced, renamed and
// the directory fsynced; at most `disk_tails` files, least recently used (file mtime) removed first.
// Damaged, foreign or stale files are removed and never used. A write error turns persistence off for
// the run with one warning. Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/file_ops.h"
#include "kv/geometry.h"

namespace cedar::kv {

inline constexpr uint32_t kTailFileVersion = 1;
inline constexpr size_t kTailFileHeaderBytes = 72;

struct TailCacheOptions {
  std::string dir;               // empty: memory only
  uint32_t memory_tails = 1024;  // tails kept in memory
  uint32_t disk_tails = 4096;    // tail files kept on disk
  FileSystem* fs = nullptr;      // nullptr: POSIX (tests inject faults)
};

struct TailCacheStats {
  uint64_t memory_tails = 0, disk_tails = 0, disk_bytes = 0;
  uint64_t hits_memory = 0, hits_disk = 0, misses = 0;
  uint64_t saved = 0, present = 0, evicted = 0;
  uint64_t damaged = 0;          // files removed: corrupt, truncated, foreign or stale
  uint64_t temp_removed = 0;     // interrupted writes removed at open
  uint64_t write_failures = 0;
  bool persistence_disabled = false;
};

class TailCache {
 public:
  static Result<std::unique_ptr<TailCache>> open(const CacheGeometry& geometry, TailCacheOptions options = {});
  ~TailCache();
  TailCache(const TailCache&) = delete;
  TailCache& operator=(const TailCache&) = delete;

  // Payload bytes of a tail of n tokens, and where owner o's main entries / index keys start in it.
  static uint64_t payload_bytes(const CacheGeometry& g, int64_t n_tokens);
  static uint64_t main_offset(const CacheGeometry& g, int64_t n_tokens, int owner);
  static uint64_t index_offset(const CacheGeometry& g, int64_t n_tokens, int owner);

  // Stores tokens[start, end) (end - start in [1, block_tokens), start a multiple of block_tokens)
  // after the prefix tokens[0, start); `payload` is payload_bytes(end - start).
  Status save(std::span<const int32_t> tokens, int64_t start, int64_t end, std::span<const uint8_t> payload);

  // The longest stored tail of prompt after its prefix [0, start), at most max_tokens long; its payload
  // goes to *payload. Returns its length (0: none).
  int64_t lookup(std::span<const int32_t> prompt, int64_t start, int64_t max_tokens, std::vector<uint8_t>* payload);

  TailCacheStats stats() const;

 private:
  struct Digest {
    uint64_t lo = 0, hi = 0;
    bool operator==(const Digest&) const = default;
  };
  struct DigestHash {
    size_t operator()(const Digest& d) const { return static_cast<size_t>(d.lo ^ (d.hi * 0x9E3779B97F4A7C15ull)); }
  };
  struct Tail {
    int64_t start = 0;
    std::vector<int32_t> tokens;   // [n] the tail's tokens
    std::vector<uint8_t> payload;  // [payload_bytes(n)] (memory tails only)
    std::string file;              // disk tails: file name inside dir
    uint64_t bytes = 0;            // disk tails: file size
    uint64_t tick = 0;             // last use
  };
  using TailMap = std::unordered_map<Digest, std::vector<Tail>, DigestHash>;

  TailCache(const CacheGeometry& g, TailCacheOptions o);
  Digest digest(std::span<const int32_t> prefix) const;
  Status scan();
  bool read_file(const std::string& name, const Digest& d, int64_t start, std::vector<int32_t>* tokens,
                 std::vector<uint8_t>* payload, std::string* why);
  void write_file(const Digest& d, int64_t start, std::span<const int32_t> tail, std::span<const uint8_t> payload);
  void remove_file(TailMap::iterator it, size_t index, uint64_t* counter, const std::string& why);
  void evict(TailMap& map, uint64_t* count, uint32_t limit, bool disk);
  void disable_persistence(int err, const std::string& what);
  uint64_t next_tick() { return ++tick_; }

  CacheGeometry g_;
  TailCacheOptions opt_;
  FileSystem* fs_;
  int dir_fd_ = -1;
  mutable std::mutex mu_;
  TailMap memory_, disk_;
  uint64_t n_memory_ = 0, n_disk_ = 0, disk_bytes_ = 0;
  uint64_t tick_ = 0;
  TailCacheStats stats_;
};

}  // namespace cedar::kv
