#include "kv/sequence.h"

#include <cstring>

namespace cedar::kv {

uint8_t* Sequence::boundary_state_mut(size_t k) {
  CEDAR_CHECK(k < blocks_.size(), "boundary state of block %zu past the block table", k);
  CEDAR_CHECK(pool_->refcount(blocks_[k]) == 1, "boundary state of a shared block %zu is read-only", k);
  return pool_->boundary_state(blocks_[k]);
}

void Sequence::capture_boundary_state(size_t k) {
  uint8_t* dst = boundary_state_mut(k);
  for (size_t o = 0; o < g_->owners.size(); ++o) {
    const uint64_t n = g_->owners[o].boundary_tail_bytes;
    if (n) std::memcpy(dst + g_->boundary_tail_offset(static_cast<int>(o)), tails_.data() + tail_offset_[o], n);
  }
  if (!engram_.empty())
    std::memcpy(dst + g_->engram_history_offset(), engram_.data(), engram_.size() * sizeof(int64_t));
}

}  // namespace cedar::kv
