// KvCache: the KV cache of a model instance. It owns the block pool, the in-memory prefix index and the
// live sequences, and (optionally) talks to a DiskPrefixCache.
//
// Life of a request:
//   Sequence* s = cache.new_sequence();
//   int64_t h = cache.attach_prefix(*s, prompt, prompt.size() - 1);   // reuse cached whole blocks
//   cache.append(*s, prompt.subspan(h));      // reserve room for the new tokens (copy on write)
//   ... forward pass writes main entries / index keys / window slots / tails through *s ...
//   cache.commit(*s);                         // index full blocks (and persist them to disk)
//   cache.release(s);
// Structural calls (everything on this class) are serialised by one mutex; entry reads/writes through a
// Sequence after append() need no lock; one sequence is used by one thread at a time. attach_prefix
// and commit read and write the disk outside the cache mutex. When the pool runs out, index-only blocks are evicted (least
// recently used leaf first); a request that still cannot fit gets ResourceExhausted.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>

#include "core/status.h"
#include "kv/block_pool.h"
#include "kv/disk_cache.h"
#include "kv/geometry.h"
#include "kv/prefix_index.h"
#include "kv/sequence.h"

namespace cedar::kv {

struct KvCacheOptions {
  uint32_t capacity_blocks = 0;          // pool size; capacity_for_tokens() helps choose it
  ChainHashFn hash = xxh3_chain_hash;    // tests force collisions with a constant hash
  DiskPrefixCache* disk = nullptr;       // optional, not owned; must outlive the cache
};

struct KvCacheStats {
  BlockPoolStats pool;
  PrefixIndexStats index;
  uint64_t sequences = 0;
  uint64_t reused_tokens_memory = 0;  // prefix tokens served from the in-memory index
  uint64_t reused_tokens_disk = 0;    // prefix tokens read back from the disk cache
  uint64_t committed_blocks = 0;
  uint64_t disk_saved_blocks = 0;
};

// Blocks needed to hold n tokens.
inline uint32_t blocks_for_tokens(int64_t n_tokens, uint32_t block_tokens) {
  return static_cast<uint32_t>((n_tokens + block_tokens - 1) / block_tokens);
}

class KvCache {
 public:
  static Result<std::unique_ptr<KvCache>> create(const CacheGeometry& geometry, const KvCacheOptions& options);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const CacheGeometry& geometry() const { return g_; }

  // A new empty sequence (its SWA ring and state are reserved now).
  Result<Sequence*> new_sequence();
  // A new sequence sharing every block of `parent` (the partial last one too); its private state
  // (window ring, tails, history) is copied. The first write that diverges copies the shared block.
  Result<Sequence*> fork(const Sequence& parent);
  // Drops the sequence and its block references.
  void release(Sequence* seq);

  // Starts an empty sequence with the longest cached prefix of `prompt` (whole blocks, at most
  // max_tokens): the in-memory index first, then the disk cache for the blocks after it. Restores the
  // boundary state of the last reused block (Engram history; leading bytes of each compressor tail).
  // Returns the number of reused tokens (0 on a miss). Pass max_tokens < prompt.size() to keep at least
  // one token to run through the model for the next-token logits.
  Result<int64_t> attach_prefix(Sequence& seq, std::span<const int32_t> prompt, int64_t max_tokens);
  // Appends tokens and reserves the blocks their entries go to. A shared partial last block is copied
  // first (copy on write at the first divergent block). On ResourceExhausted nothing changed.
  Status append(Sequence& seq, std::span<const int32_t> tokens);
  // Sizes the sequence's token and block tables for n_tokens, so appends up to it do not allocate.
  void reserve(Sequence& seq, int64_t n_tokens);
  // Shortens the sequence to n_tokens (e.g. rejected draft tokens). Entries of the dropped tokens are
  // rewritten by the forward pass after the next append.
  Status truncate(Sequence& seq, int64_t n_tokens);
  // Publishes the sequence's full blocks in the prefix index and, with a disk cache, persists them.
  // Blocks must be complete (all entries and the boundary state written).
  Status commit(Sequence& seq);

  KvCacheStats stats() const;
  // The pool and index, for tests and reports (not for concurrent use).
  const BlockPool& pool() const { return *pool_; }
  const PrefixIndex& index() const { return *index_; }

 private:
  KvCache(const CacheGeometry& g, const KvCacheOptions& o) : g_(g), opt_(o) {}
  std::optional<BlockId> allocate_block();
  std::optional<BlockId> copy_block(BlockId src);
  Status init_private_state(Sequence& s);
  void ensure_hashes(Sequence& s, size_t n_full);
  void restore_boundary_state(Sequence& s);

  CacheGeometry g_;
  KvCacheOptions opt_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<PrefixIndex> index_;
  std::unordered_map<SequenceId, std::unique_ptr<Sequence>> seqs_;
  SequenceId next_id_ = 1;
  mutable std::mutex mu_;
  KvCacheStats stats_;
};

}  // namespace cedar::kv
