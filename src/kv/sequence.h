// Sequence: one sequence's view of the KV cache. Global KV lives in shared pool blocks listed by the
// block table; everything else a sequence needs is private to it:
//   * the SWA ring of every windowed layer (window_slots entries each, token p in slot p % slots),
//   * the live compressor tail of every KV owner (opaque fp32 state of the group being pooled),
//   * the Engram history (compressed token ids of the last engram_history positions),
//   * the tokens themselves (they key the prefix index).
// Sequences are created, extended, forked and released through KvCache; the entry accessors here are
// what the forward pass reads and writes. Writes go only to entries of tokens appended by this
// sequence (KvCache::append has already made those blocks private: copy on write).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/check.h"
#include "kv/block_pool.h"
#include "kv/geometry.h"
#include "kv/prefix_index.h"
#include "kv/region.h"

namespace cedar::kv {

using SequenceId = uint64_t;

class Sequence {
 public:
  SequenceId id() const { return id_; }
  const CacheGeometry& geometry() const { return *g_; }
  int64_t n_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  std::span<const int32_t> tokens() const { return tokens_; }
  const std::vector<BlockId>& block_table() const { return blocks_; }
  // Tokens whose global KV came from the prefix cache at attach time (a multiple of block_tokens).
  int64_t reused_prefix_tokens() const { return reused_tokens_; }

  // ---- global KV of owner o (index into geometry().owners), entry j covers tokens [j*r, (j+1)*r) ----
  const uint8_t* main_entry(int o, int64_t j) const { return entry_ptr(o, j, false); }
  uint8_t* main_entry_mut(int o, int64_t j) { return writable(entry_ptr(o, j, false), o, j); }
  const uint8_t* index_key(int o, int64_t j) const { return entry_ptr(o, j, true); }
  uint8_t* index_key_mut(int o, int64_t j) { return writable(entry_ptr(o, j, true), o, j); }
  // Owner o's entries inside block b are contiguous: entries [b*epb, (b+1)*epb) (epb =
  // entries_per_block) start at these pointers, for kernels that stream a block at a time.
  const uint8_t* main_entries_of_block(int o, size_t b) const {
    return pool_->block_data(blocks_[b]) + g_->owners[o].main_offset;
  }
  const uint8_t* index_keys_of_block(int o, size_t b) const {
    return pool_->block_data(blocks_[b]) + g_->owners[o].index_offset;
  }
  // Entries of owner o whose group is complete (the reference's compress_len at n_tokens).
  int64_t complete_entries(int o) const { return n_tokens() / g_->owners[o].ratio; }
  // Owner index of the global KV that `layer` reads (-1: none).
  int owner_of_layer(int layer) const { return g_->owner_of_layer[layer]; }

  // ---- SWA ring ----
  // Slot of position `pos` in `layer`'s ring (the layer must have a window).
  uint8_t* window_slot(int layer, int64_t pos) {
    return window_.data() + window_offset(layer, pos);
  }
  const uint8_t* window_slot(int layer, int64_t pos) const { return window_.data() + window_offset(layer, pos); }

  // ---- small per-sequence state ----
  std::span<uint8_t> compressor_tail(int o) {
    return {tails_.data() + tail_offset_[o], g_->owners[o].live_tail_bytes};
  }
  std::span<int64_t> engram_history() { return engram_; }
  std::span<const int64_t> engram_history() const { return engram_; }

  // Boundary state of full block k (geometry().boundary_state_bytes): each owner's boundary tail, then
  // the Engram history, as of the block's last token. The forward pass writes it for blocks this
  // sequence computed; a resume from a cached prefix restores it (KvCache::attach_prefix).
  uint8_t* boundary_state_mut(size_t k);
  const uint8_t* boundary_state(size_t k) const { return pool_->boundary_state(blocks_[k]); }
  // Fills block k's boundary record from this sequence's live state (tails' leading
  // boundary_tail_bytes and the current Engram history); for a block that just became full.
  void capture_boundary_state(size_t k);

  // Bytes of this sequence's SWA rings (one mapping for every windowed layer).
  uint64_t window_bytes() const { return window_.size(); }
  // Bytes this sequence holds outside the shared pool (window ring + tails + history).
  uint64_t private_bytes() const {
    return window_.size() + tails_.size() + engram_.size() * sizeof(int64_t);
  }

 private:
  friend class KvCache;
  Sequence() = default;

  const uint8_t* entry_ptr(int o, int64_t j, bool index) const {
    const OwnerGeometry& og = g_->owners[o];
    const int64_t block = j / og.entries_per_block;
    const int64_t in_block = j % og.entries_per_block;
    CEDAR_DCHECK(block < static_cast<int64_t>(blocks_.size()), "entry %lld past the block table", (long long)j);
    const uint8_t* base = pool_->block_data(blocks_[block]);
    return index ? base + og.index_offset + in_block * og.index_entry_bytes
                 : base + og.main_offset + in_block * og.main_entry_bytes;
  }
  uint8_t* writable(const uint8_t* p, int o, int64_t j) {
    CEDAR_DCHECK(pool_->refcount(blocks_[j / g_->owners[o].entries_per_block]) == 1,
                 "write into a shared block (append first)");
    return const_cast<uint8_t*>(p);
  }
  size_t window_offset(int layer, int64_t pos) const {
    const int w = g_->window_of_layer[layer];
    CEDAR_DCHECK(w >= 0, "layer %d has no window", layer);
    return (static_cast<size_t>(w) * g_->window_slots + static_cast<size_t>(pos % g_->window_slots)) *
           g_->window_entry_bytes;
  }

  SequenceId id_ = 0;
  const CacheGeometry* g_ = nullptr;
  BlockPool* pool_ = nullptr;
  std::vector<int32_t> tokens_;
  std::vector<BlockId> blocks_;                // every block touched by tokens_, the last may be partial
  std::vector<PrefixIndex::NodeId> nodes_;     // index entry of each full block, kRoot while unindexed
  std::vector<uint64_t> hashes_;               // chain hashes of full blocks computed so far
  size_t disk_saved_blocks_ = 0;               // leading full blocks known to be on disk
  AnonymousRegion window_;
  std::vector<uint8_t> tails_;
  std::vector<uint64_t> tail_offset_;
  std::vector<int64_t> engram_;
  int64_t reused_tokens_ = 0;
};

}  // namespace cedar::kv
