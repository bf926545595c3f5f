#include "model/sequence_state.h"

#include <algorithm>
#include <limits>

namespace cedar::model {

SequenceState& SequenceState::operator=(SequenceState&& o) noexcept {
  if (this == &o) return *this;
  release();
  n_tokens = o.n_tokens;
  capacity = o.capacity;
  owner_entries = std::move(o.owner_entries);
  index_key_slot = o.index_key_slot;
  engram = std::move(o.engram);
  window_floor = o.window_floor;
  replay_until = o.replay_until;
  kv_dtype = o.kv_dtype;
  home_ = o.home_;
  own_home_ = std::move(o.own_home_);
  kv_ = o.kv_;
  o.home_ = nullptr;
  o.kv_ = nullptr;
  return *this;
}

void SequenceState::release() {
  if (kv_) home_->release(kv_);
  kv_ = nullptr;
  home_ = nullptr;
  own_home_.reset();  // after the sequence: it may be the last reference to the cache
}

Result<SequenceState> SequenceState::create(kv::KvCache& home, std::shared_ptr<kv::KvCache> own_home,
                                            int64_t capacity, KvDtype dtype) {
  SequenceState s;
  CEDAR_ASSIGN_OR_RETURN(s.kv_, home.new_sequence());
  s.home_ = &home;
  s.own_home_ = std::move(own_home);
  s.capacity = capacity;
  s.kv_dtype = dtype;
  s.engram.compressed.reserve(static_cast<size_t>(capacity));
  const kv::CacheGeometry& g = home.geometry();
  s.owner_entries.assign(g.owners.size(), 0);
  // The reference's score buffers start at -inf (an empty group member never wins the softmax).
  for (size_t o = 0; o < g.owners.size(); ++o)
    if (g.owners[o].live_tail_bytes) {
      float* score = s.compressor_score(static_cast<int>(o));
      std::fill(score, score + g.owners[o].live_tail_bytes / 2 / sizeof(float),
                -std::numeric_limits<float>::infinity());
    }
  return s;
}

Result<SequenceState> SequenceState::fork() const {
  if (!kv_) return failed_precondition("fork of an empty sequence state");
  SequenceState s;
  CEDAR_ASSIGN_OR_RETURN(s.kv_, home_->fork(*kv_));
  s.home_ = home_;
  s.own_home_ = own_home_;
  s.n_tokens = n_tokens;
  s.capacity = capacity;
  s.owner_entries = owner_entries;
  s.index_key_slot = index_key_slot;
  s.engram.compressed.reserve(static_cast<size_t>(capacity));
  s.engram.compressed = engram.compressed;
  s.window_floor = window_floor;
  s.replay_until = replay_until;
  s.kv_dtype = kv_dtype;
  home_->reserve(*s.kv_, capacity);
  return s;
}

uint64_t sequence_state_bytes(const kv::CacheGeometry& g, int64_t capacity) {
  const uint64_t cap = static_cast<uint64_t>(capacity);
  return uint64_t{kv::blocks_for_tokens(capacity, g.block_tokens)} * g.block_bytes + g.window_bytes_per_sequence() +
         g.live_tail_bytes_per_sequence() + g.engram_history_bytes() + cap * sizeof(int32_t) * 2;  // tokens, Engram
}

uint64_t held_bytes(const SequenceState& s) {
  const kv::CacheGeometry& g = s.geometry();
  return s.kv().block_table().size() * g.block_bytes + s.kv().private_bytes() +
         s.kv().tokens().size() * sizeof(int32_t) + s.engram.compressed.capacity() * sizeof(int32_t);
}

}  // namespace cedar::model
