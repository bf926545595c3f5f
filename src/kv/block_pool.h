// BlockPool: fixed-size blocks of global KV (block_tokens tokens of every KV-owner layer, layout in
// geometry.h) with reference counts. A block is shared by every sequence whose block table lists it
// and by the prefix index while it is cached there; it returns to the free list when the last
// reference goes. Blocks are never written while shared: KvCache copies a shared block before the
// first write that would diverge (copy on write).
//
// Storage is two anonymous mappings reserved once for `capacity_blocks` (touched lazily), so the
// reserved size is exactly capacity * block_bytes. Not thread-safe: KvCache serialises structural
// calls; reading and writing entry bytes through block_data() needs no lock.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/status.h"
#include "kv/geometry.h"
#include "kv/region.h"

namespace cedar::kv {

using BlockId = uint32_t;
inline constexpr BlockId kNoBlock = UINT32_MAX;

struct BlockPoolStats {
  uint32_t capacity_blocks = 0;
  uint32_t blocks_in_use = 0;
  uint64_t allocations = 0;
  uint64_t copies = 0;  // copy-on-write copies
  uint64_t frees = 0;
};

class BlockPool {
 public:
  static Result<std::unique_ptr<BlockPool>> create(const CacheGeometry& geometry, uint32_t capacity_blocks);

  const CacheGeometry& geometry() const { return geometry_; }
  // A free block with refcount 1, or nullopt when every block is in use.
  std::optional<BlockId> allocate();
  // A new block (refcount 1) holding a copy of src's KV and boundary state; nullopt when full.
  std::optional<BlockId> copy(BlockId src);
  void retain(BlockId id);
  // Drops one reference; the block is free again at zero.
  void release(BlockId id);
  uint32_t refcount(BlockId id) const { return refcount_[id]; }

  uint8_t* block_data(BlockId id) { return kv_.data() + uint64_t{id} * geometry_.block_bytes; }
  const uint8_t* block_data(BlockId id) const { return kv_.data() + uint64_t{id} * geometry_.block_bytes; }
  uint8_t* boundary_state(BlockId id) { return boundary_.data() + uint64_t{id} * geometry_.boundary_state_bytes; }
  const uint8_t* boundary_state(BlockId id) const {
    return boundary_.data() + uint64_t{id} * geometry_.boundary_state_bytes;
  }

  uint32_t capacity_blocks() const { return static_cast<uint32_t>(refcount_.size()); }
  uint32_t blocks_in_use() const { return capacity_blocks() - static_cast<uint32_t>(free_.size()); }
  uint32_t free_blocks() const { return static_cast<uint32_t>(free_.size()); }
  // Address space reserved for KV blocks and for boundary-state records.
  uint64_t reserved_kv_bytes() const { return kv_.size(); }
  uint64_t reserved_boundary_bytes() const { return boundary_.size(); }
  BlockPoolStats stats() const;

 private:
  BlockPool(const CacheGeometry& g) : geometry_(g) {}

  CacheGeometry geometry_;
  AnonymousRegion kv_;
  AnonymousRegion boundary_;
  std::vector<uint32_t> refcount_;  // [capacity] 0 = free
  std::vector<BlockId> free_;       // stack; the lowest ids are handed out first
  uint64_t allocations_ = 0, copies_ = 0, frees_ = 0;
};

}  // namespace cedar::kv
