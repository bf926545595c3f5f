#include "kv/block_pool.h"

#include <cstring>

#include "core/check.h"

namespace cedar::kv {

Result<std::unique_ptr<BlockPool>> BlockPool::create(const CacheGeometry& geometry, uint32_t capacity_blocks) {
  if (capacity_blocks == 0 || capacity_blocks == kNoBlock)
    return invalid_argument("kv: block pool capacity must be in [1, 2^32-2] blocks");
  std::unique_ptr<BlockPool> pool(new BlockPool(geometry));
  CEDAR_ASSIGN_OR_RETURN(pool->kv_, AnonymousRegion::map(uint64_t{capacity_blocks} * geometry.block_bytes,
                                                         "the KV block pool"));
  CEDAR_ASSIGN_OR_RETURN(pool->boundary_,
                         AnonymousRegion::map(uint64_t{capacity_blocks} * geometry.boundary_state_bytes,
                                              "block boundary states"));
  pool->refcount_.assign(capacity_blocks, 0);
  pool->free_.resize(capacity_blocks);
  for (uint32_t i = 0; i < capacity_blocks; ++i) pool->free_[i] = capacity_blocks - 1 - i;
  return pool;
}

std::optional<BlockId> BlockPool::allocate() {
  if (free_.empty()) return std::nullopt;
  const BlockId id = free_.back();
  free_.pop_back();
  CEDAR_CHECK(refcount_[id] == 0, "block %u on the free list has refcount %u", id, refcount_[id]);
  refcount_[id] = 1;
  ++allocations_;
  return id;
}

std::optional<BlockId> BlockPool::copy(BlockId src) {
  CEDAR_CHECK(src < capacity_blocks() && refcount_[src] > 0, "copy of a free block %u", src);
  const auto dst = allocate();
  if (!dst) return std::nullopt;
  std::memcpy(block_data(*dst), block_data(src), geometry_.block_bytes);
  std::memcpy(boundary_state(*dst), boundary_state(src), geometry_.boundary_state_bytes);
  ++copies_;
  return dst;
}

void BlockPool::retain(BlockId id) {
  CEDAR_CHECK(id < capacity_blocks() && refcount_[id] > 0, "retain of a free block %u", id);
  ++refcount_[id];
}

void BlockPool::release(BlockId id) {
  CEDAR_CHECK(id < capacity_blocks() && refcount_[id] > 0, "release of a free block %u", id);
  if (--refcount_[id] == 0) {
    free_.push_back(id);
    ++frees_;
  }
}

BlockPoolStats BlockPool::stats() const {
  BlockPoolStats s;
  s.capacity_blocks = capacity_blocks();
  s.blocks_in_use = blocks_in_use();
  s.allocations = allocations_;
  s.copies = copies_;
  s.frees = frees_;
  return s;
}

}  // namespace cedar::kv
