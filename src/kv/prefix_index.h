// PrefixIndex: the in-memory content-addressed index of cached KV blocks, so sequences that share a
// prompt prefix share its blocks.
//
// Block k of a token sequence is keyed by a chained hash: h_k = H(h_{k-1}, tokens of block k) with
// h_{-1} derived from the model/layout fingerprint, H = XXH3-64 seeded with the previous hash. The hash
// only narrows the search: an entry matches when its parent entry is the one matched for block k-1 AND
// its stored tokens equal the block's tokens, so by induction the whole prefix is compared token for
// token and two prefixes whose hashes collide can never be confused. Each entry holds one reference on
// its block; eviction (PrefixLru) drops the least recently used leaf that no live sequence still uses.
// Not thread-safe (KvCache serialises calls).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "kv/prefix_lru.h"

namespace cedar::kv {

// H(parent, tokens) of one block. Replaceable so tests can force collisions.
using ChainHashFn = uint64_t (*)(uint64_t parent_hash, std::span<const int32_t> block_tokens);
uint64_t xxh3_chain_hash(uint64_t parent_hash, std::span<const int32_t> block_tokens);
// h_{-1}: the seed of block 0's hash for a cache layout.
uint64_t chain_root_hash(uint64_t layout_fingerprint);
// Chained hashes of the first n_blocks whole blocks of `tokens`.
std::vector<uint64_t> chain_hashes(std::span<const int32_t> tokens, uint32_t block_tokens, size_t n_blocks,
                                   uint64_t root, ChainHashFn hash = xxh3_chain_hash);

struct PrefixIndexStats {
  uint64_t lookups = 0;
  uint64_t hit_blocks = 0;
  uint64_t inserted = 0;
  uint64_t duplicates = 0;       // insert of content already indexed (kept the existing block)
  uint64_t hash_collisions = 0;  // same hash, different parent or tokens: rejected by comparison
  uint64_t evicted = 0;
};

class PrefixIndex {
 public:
  using NodeId = PrefixLru::NodeId;
  static constexpr NodeId kRoot = PrefixLru::kNoParent;

  PrefixIndex(BlockPool& pool, uint64_t root_hash, ChainHashFn hash = xxh3_chain_hash)
      : pool_(pool), root_hash_(root_hash), hash_(hash) {}
  ~PrefixIndex();
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  struct Match {
    std::vector<BlockId> blocks;  // the matched blocks, in order (no reference taken)
    std::vector<NodeId> nodes;    // their index entries
  };
  // The longest indexed prefix of `tokens` in whole blocks, at most max_blocks; the match is marked
  // as used. `hashes` are the chain hashes of tokens' blocks (chain_hashes()).
  Match lookup(std::span<const int32_t> tokens, std::span<const uint64_t> hashes, size_t max_blocks);
  // Indexes `block` as the child of entry `parent` (kRoot for block 0) with chain hash `hash`. When the
  // same content is already indexed the existing entry is returned and `block` is not referenced.
  NodeId insert(NodeId parent, uint64_t hash, std::span<const int32_t> block_tokens, BlockId block);
  // Drops the least recently used leaf whose block no sequence uses; false when there is none.
  bool evict_one();

  bool contains(NodeId node) const { return entries_.count(node) > 0; }
  BlockId block_of(NodeId node) const { return entries_.at(node).block; }
  size_t size() const { return entries_.size(); }
  uint64_t root_hash() const { return root_hash_; }
  ChainHashFn hash_fn() const { return hash_; }
  const PrefixLru& lru() const { return lru_; }
  PrefixIndexStats stats() const { return stats_; }

 private:
  struct Entry {
    NodeId parent = kRoot;
    uint64_t hash = 0;
    BlockId block = kNoBlock;
    std::vector<int32_t> tokens;  // the block's tokens, compared on every hit
  };
  NodeId find(NodeId parent, uint64_t hash, std::span<const int32_t> block_tokens);

  BlockPool& pool_;
  uint64_t root_hash_;
  ChainHashFn hash_;
  std::unordered_map<NodeId, Entry> entries_;
  std::unordered_multimap<uint64_t, NodeId> by_hash_;
  PrefixLru lru_;
  NodeId next_id_ = 1;
  uint64_t clock_ = 0;
  PrefixIndexStats stats_;
};

}  // namespace cedar::kv
