// Per-sequence inference state: the caches the V4.1 reference keeps in module buffers, stored packed
// as the KV economy intends (spec §5.1). Dequantising an entry gives exactly the bf16 values the
// reference attends to.
//
// The KV cache has one home, a kv::KvCache (kv/kv_cache.h): a sequence's global KV is blocks of its
// pool, listed by the sequence's kv::Sequence, which the forward pass reads and writes in place:
//   main KV       every KV owner, one entry per group: head_dim E2M1 + head_dim/16 E4M3 scales
//   index keys    every KV owner, one per group: index_head_dim E2M1 + index_head_dim/32 E8M0
// A prefix-cache hit attaches cached blocks (a reference-count bump, no copy), and a finished sequence
// publishes its blocks in the same pool. What is private to one sequence lives beside the blocks in the
// kv::Sequence (one named place, sized by the same kv::CacheGeometry):
//   window ring   every backbone layer, window_size slots of head_dim E4M3 + head_dim/32 E8M0
//   compressor    ratio-2 owners: the pending group's (kv, score) rows in fp32
// and here: the Engram history (compressed ids of every position) and the replay bounds.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kv/kv_cache.h"
#include "model/engram_hash.h"

namespace cedar::model {

class SequenceJournal;

// How window and main KV entries are stored. kReference is the released model's format above (what
// the reference attends to, bit for bit); kBf16 is an experiment of `cedar eval` (docs/EVAL.md): the
// window and main entries are kept as bf16 (no FP8/FP4 quantise-dequantise), the index keys stay FP4.
// The prefix cache stores only the reference format.
enum class KvDtype { kReference, kBf16 };

class SequenceState {
 public:
  SequenceState() = default;  // holds nothing; Model::new_sequence makes usable ones
  SequenceState(SequenceState&& o) noexcept { *this = std::move(o); }
  SequenceState& operator=(SequenceState&& o) noexcept;
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;
  ~SequenceState() { release(); }

  // A state for up to `capacity` positions whose global KV goes to `home`'s pool. `own_home` is set
  // when the state has a cache of its own (Model::new_sequence without a home); it outlives the state.
  static Result<SequenceState> create(kv::KvCache& home, std::shared_ptr<kv::KvCache> own_home, int64_t capacity,
                                      KvDtype dtype);

  int64_t n_tokens = 0;   // positions processed so far
  int64_t capacity = 0;   // most positions this state can hold
  // Compressed entries each KV owner has written (index: kv::CacheGeometry::owners), the reference's
  // compress_len; entries past it are being (re)written.
  std::vector<int64_t> owner_entries;
  // The reference's shared index-key slot (SharedAttentionRuntime.index_k): the KV owner layer whose
  // index-key cache was published last. It persists across forward calls (spec §9.1).
  int index_key_slot = -1;
  EngramHistory engram;
  // Bounded replay after a prefix-cache hit (spec §8): window attention never reaches positions
  // below window_floor, and positions below replay_until only rebuild window KV (their compressed
  // KV, index keys and compressor state were restored, not recomputed).
  int64_t window_floor = 0;
  int64_t replay_until = 0;
  KvDtype kv_dtype = KvDtype::kReference;
  // A speculative verify pass in progress (sequence_journal.h): the forward hands it the compressor
  // rows it overwrites. Not owned; null otherwise. (Moves do not carry it: a pass never spans a move.)
  SequenceJournal* journal = nullptr;

  // A second sequence continuing from this one's positions: it shares every block of global KV (the
  // first write that diverges copies the partial last block) and copies the private state.
  Result<SequenceState> fork() const;

  bool valid() const { return kv_ != nullptr; }
  kv::KvCache& home() const { return *home_; }
  kv::Sequence& kv() { return *kv_; }
  const kv::Sequence& kv() const { return *kv_; }
  const kv::CacheGeometry& geometry() const { return kv_->geometry(); }
  // The ids of the positions processed so far. (The kv::Sequence may already hold more: the tokens a
  // prefix cache restored ahead of a bounded replay.)
  std::span<const int32_t> tokens() const { return kv_->tokens().first(static_cast<size_t>(n_tokens)); }
  // Owner index (kv::CacheGeometry::owners) of the global KV `layer` reads or writes, -1 if none.
  int owner_of_layer(int layer) const { return kv_->owner_of_layer(layer); }
  // The SWA ring of `layer`: window_size slots of geometry().window_entry_bytes, position p in slot p % slots.
  uint8_t* window_ring(int layer) { return kv_->window_slot(layer, 0); }
  // Owner o's compressor state (ratio > 1): [ratio, head_dim] kv rows, then as many score rows.
  float* compressor_kv(int o) { return reinterpret_cast<float*>(kv_->compressor_tail(o).data()); }
  float* compressor_score(int o) {
    const auto tail = kv_->compressor_tail(o);
    return reinterpret_cast<float*>(tail.data() + tail.size() / 2);
  }

 private:
  void release();
  kv::KvCache* home_ = nullptr;
  std::shared_ptr<kv::KvCache> own_home_;
  kv::Sequence* kv_ = nullptr;
};

// Bytes a state for `capacity` positions holds at most (what a server reserves per request): its
// blocks of global KV, window rings, compressor state, tokens and Engram history.
uint64_t sequence_state_bytes(const kv::CacheGeometry& g, int64_t capacity);
// The bytes a state holds now (its blocks, counted whole even when shared, and its private state).
uint64_t held_bytes(const SequenceState& s);

}  // namespace cedar::model
