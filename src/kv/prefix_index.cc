#include "kv/prefix_index.h"

#include <xxhash.h>

#include <algorithm>

#include "core/check.h"

namespace cedar::kv {

uint64_t xxh3_chain_hash(uint64_t parent_hash, std::span<const int32_t> block_tokens) {
  return XXH3_64bits_withSeed(block_tokens.data(), block_tokens.size_bytes(), parent_hash);
}

uint64_t chain_root_hash(uint64_t layout_fingerprint) {
  return XXH3_64bits(&layout_fingerprint, sizeof(layout_fingerprint));
}

std::vector<uint64_t> chain_hashes(std::span<const int32_t> tokens, uint32_t block_tokens, size_t n_blocks,
                                   uint64_t root, ChainHashFn hash) {
  CEDAR_CHECK(n_blocks * block_tokens <= tokens.size(), "chain_hashes past the end of the tokens");
  std::vector<uint64_t> out(n_blocks);
  uint64_t h = root;
  for (size_t k = 0; k < n_blocks; ++k) {
    h = hash(h, tokens.subspan(k * block_tokens, block_tokens));
    out[k] = h;
  }
  return out;
}

PrefixIndex::~PrefixIndex() {
  for (const auto& [id, e] : entries_) pool_.release(e.block);
}

PrefixIndex::NodeId PrefixIndex::find(NodeId parent, uint64_t hash, std::span<const int32_t> block_tokens) {
  auto [lo, hi] = by_hash_.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    const Entry& e = entries_.at(it->second);
    if (e.parent == parent && std::equal(e.tokens.begin(), e.tokens.end(), block_tokens.begin(), block_tokens.end()))
      return it->second;
    ++stats_.hash_collisions;
  }
  return kRoot;
}

PrefixIndex::Match PrefixIndex::lookup(std::span<const int32_t> tokens, std::span<const uint64_t> hashes,
                                       size_t max_blocks) {
  ++stats_.lookups;
  Match m;
  const uint32_t bt = pool_.geometry().block_tokens;
  const size_t n = std::min({max_blocks, hashes.size(), tokens.size() / bt});
  NodeId parent = kRoot;
  for (size_t k = 0; k < n; ++k) {
    const NodeId node = find(parent, hashes[k], tokens.subspan(k * bt, bt));
    if (node == kRoot) break;
    m.blocks.push_back(entries_.at(node).block);
    m.nodes.push_back(node);
    parent = node;
  }
  if (!m.nodes.empty()) lru_.touch_path(m.nodes.back(), ++clock_);
  stats_.hit_blocks += m.blocks.size();
  return m;
}

PrefixIndex::NodeId PrefixIndex::insert(NodeId parent, uint64_t hash, std::span<const int32_t> block_tokens,
                                        BlockId block) {
  CEDAR_CHECK(block_tokens.size() == pool_.geometry().block_tokens, "insert of a partial block");
  CEDAR_CHECK(parent == kRoot || entries_.count(parent), "insert under a missing parent entry");
  if (const NodeId existing = find(parent, hash, block_tokens); existing != kRoot) {
    ++stats_.duplicates;
    lru_.touch_path(existing, ++clock_);
    return existing;
  }
  const NodeId id = next_id_++;
  Entry e;
  e.parent = parent;
  e.hash = hash;
  e.block = block;
  e.tokens.assign(block_tokens.begin(), block_tokens.end());
  pool_.retain(block);
  entries_.emplace(id, std::move(e));
  by_hash_.emplace(hash, id);
  lru_.add(id, parent, pool_.geometry().block_bytes, ++clock_);
  ++stats_.inserted;
  return id;
}

bool PrefixIndex::evict_one() {
  // Only the index's own reference left: evicting frees memory. A block still listed by a sequence
  // would stay allocated, so dropping it from the index would only lose the sharing.
  const auto victim = lru_.victim([this](NodeId id) { return pool_.refcount(entries_.at(id).block) == 1; });
  if (!victim) return false;
  auto it = entries_.find(*victim);
  auto [lo, hi] = by_hash_.equal_range(it->second.hash);
  for (auto h = lo; h != hi; ++h) {
    if (h->second == *victim) {
      by_hash_.erase(h);
      break;
    }
  }
  pool_.release(it->second.block);
  entries_.erase(it);
  lru_.remove(*victim);
  ++stats_.evicted;
  return true;
}

}  // namespace cedar::kv
