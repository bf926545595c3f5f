// DiskPrefixCache: a durable, content-addressed cache of global KV blocks (never SWA) in a directory,
// so a prompt prefix computed before a restart can be reused after it.
//
// One file per block (block_file.h), named <chain hash>-<uid>.kvb; a block's file records the uid of
// the previous block's file, so a stored prefix is a chain from a depth-0 file. A lookup follows the
// chain from block 0 and accepts a file only when its parent is the file accepted for the previous
// block and its tokens equal the prompt's (hash collisions are harmless), and, before its KV is used,
// when every header field and the body checksum check out.
//
// Durability: a file is written as <uid>.part, fsynced, renamed to its final name, and the directory is
// fsynced, so a crash or kill -9 leaves either a complete file or a .part that is never read (removed on
// the next open). The directory is locked (flock) by one process at a time.
// Damage: corrupt, truncated, foreign (other model/layout or not ours), stale (other format version) and
// orphaned files (their parent is gone) are counted, logged and removed, and never used; a damaged file's
// descendants go with it.
// Budget: total file bytes stay within budget_bytes. Eviction is PrefixLru (least recently used leaf;
// see prefix_lru.h for why long prefixes are not starved); the chain being saved is never evicted for
// itself: a save that cannot fit stops early and keeps the leading blocks. Use times persist as file
// mtimes, so the order survives restarts.
// A write error (ENOSPC, EDQUOT, EIO, ...) removes the partial file, logs one warning, and turns
// persistence off for the rest of the run; loads keep working. Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/block_file.h"
#include "kv/file_ops.h"
#include "kv/geometry.h"
#include "kv/prefix_lru.h"

namespace cedar::kv {

struct DiskCacheOptions {
  uint64_t budget_bytes = 64ull << 30;  // total bytes of block files kept
  int zstd_level = 0;                   // > 0: zstd-compress payloads (see docs/KV.md for the measurement)
  FileSystem* fs = nullptr;             // nullptr: POSIX (tests inject faults here)
};

struct DiskCacheStats {
  uint64_t files = 0;            // block files currently indexed
  uint64_t bytes = 0;            // their total size
  uint64_t budget_bytes = 0;
  uint64_t loaded_blocks = 0;    // blocks read back and handed out
  uint64_t saved_blocks = 0;     // files written
  uint64_t present_blocks = 0;   // save found the block already stored
  uint64_t evicted = 0;          // files removed for the budget
  uint64_t budget_stops = 0;     // saves cut short because the budget could not fit their next block
  uint64_t hash_collisions = 0;  // candidates with the right hash but other tokens / parent
  uint64_t corrupt = 0, truncated = 0, foreign = 0, stale = 0, orphaned = 0;
  uint64_t temp_removed = 0;     // leftover .part files from interrupted writes
  uint64_t write_failures = 0;
  uint64_t skipped_saves = 0;    // save() calls ignored because persistence is off
  bool persistence_disabled = false;
};

class DiskPrefixCache {
 public:
  // Opens (creating if needed) and scans `dir`. Fails when the directory cannot be created/read or is
  // locked by another process; the caller then runs without a disk cache.
  static Result<std::unique_ptr<DiskPrefixCache>> open(const std::string& dir, const CacheGeometry& geometry,
                                                       DiskCacheOptions options = {});
  ~DiskPrefixCache();
  DiskPrefixCache(const DiskPrefixCache&) = delete;
  DiskPrefixCache& operator=(const DiskPrefixCache&) = delete;

  struct BlockView {
    const uint8_t* kv;              // block_bytes
    const uint8_t* boundary_state;  // boundary_state_bytes
  };
  struct SaveResult {
    size_t written = 0;   // new files
    size_t present = 0;   // already stored
    bool complete = true; // false: stopped early (budget, write error, persistence off)
  };
  // Persists the prefix made of blocks.size() whole blocks of `tokens` (hashes: their chain hashes).
  SaveResult save(std::span<const int32_t> tokens, std::span<const uint64_t> hashes,
                  std::span<const BlockView> blocks);

  // Receives block k's verified KV and boundary state; returns false to stop (e.g. no memory).
  using BlockSink = std::function<bool(size_t k, std::span<const uint8_t> kv, std::span<const uint8_t> boundary)>;
  // Follows the stored chain of `tokens` (at most hashes.size() blocks); blocks before first_block are
  // only matched by their tokens (the caller already has them), later ones are read, fully verified and
  // passed to `sink`. Returns the number of blocks handed to the sink.
  size_t load(std::span<const int32_t> tokens, std::span<const uint64_t> hashes, size_t first_block,
              const BlockSink& sink);

  // How many leading blocks of `tokens` are stored (matched by hash and tokens; no payload is read and
  // nothing counts as used).
  size_t stored_blocks(std::span<const int32_t> tokens, std::span<const uint64_t> hashes);

  DiskCacheStats stats() const;
  const std::string& dir() const { return dir_; }
  // Size of one uncompressed block file (header + tokens + boundary state + KV).
  uint64_t block_file_bytes() const;

 private:
  struct Entry {
    uint64_t hash = 0;
    uint64_t uid = 0;
    uint64_t parent_uid = 0;
    uint32_t depth = 0;
    uint64_t size = 0;
  };
  DiskPrefixCache(std::string dir, const CacheGeometry& g, DiskCacheOptions o);
  Status scan();
  std::string file_path(uint64_t hash, uint64_t uid) const;
  std::string temp_path(uint64_t uid) const;
  // The stored child of `parent_uid` for block k, matched by hash and tokens; 0 when none.
  uint64_t match(uint64_t parent_uid, uint64_t hash, std::span<const int32_t> block_tokens);
  // Removes an entry's file and every descendant; `counter` counts the entry itself.
  void remove_subtree(uint64_t uid, uint64_t* counter, const std::string& reason);
  bool make_room(uint64_t bytes, const std::vector<uint64_t>& chain);
  uint64_t write_block(uint64_t parent_uid, uint32_t depth, uint64_t hash, std::span<const int32_t> block_tokens,
                       const BlockView& view);
  void disable_persistence(int err, const std::string& what);
  void touch_chain(const std::vector<uint64_t>& chain);
  uint64_t next_tick();
  uint64_t new_uid();

  std::string dir_;
  CacheGeometry g_;
  DiskCacheOptions opt_;
  FileSystem* fs_;
  int lock_fd_ = -1;
  int dir_fd_ = -1;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_;                    // by uid
  std::unordered_multimap<uint64_t, uint64_t> by_hash_;            // chain hash -> uid
  std::unordered_map<uint64_t, std::vector<uint64_t>> children_;   // uid -> child uids
  PrefixLru lru_;
  uint64_t last_tick_ = 0;
  uint64_t uid_state_ = 0;
  DiskCacheStats stats_;
};

}  // namespace cedar::kv
