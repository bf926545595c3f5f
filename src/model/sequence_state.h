// Per-sequence inference state: the caches the V4.1 reference keeps in module buffers, stored packed
// as the KV economy intends (spec §5.1). Dequantising an entry gives exactly the bf16 values the
// reference attends to:
//   window ring   every backbone layer, window_size slots of head_dim E4M3 + head_dim/32 E8M0
//   main KV       every KV owner, one entry per group: head_dim E2M1 + head_dim/16 E4M3 scales
//   index keys    every KV owner, one per group: index_head_dim E2M1 + index_head_dim/32 E8M0
//   compressor    ratio-2 owners: the pending group's (kv, score) rows in fp32
//   Engram        compressed ids of every position
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/engram_hash.h"
#include "model/layer_plan.h"

namespace cedar::model {

class SequenceJournal;

// How window and main KV entries are stored. kReference is the released model's format above (what
// the reference attends to, bit for bit); kBf16 is an experiment of `cedar eval` (docs/EVAL.md): the
// window and main entries are kept as bf16 (no FP8/FP4 quantise-dequantise), the index keys stay FP4.
// The prefix cache stores only the reference format.
enum class KvDtype { kReference, kBf16 };

struct KvEntryFormat {
  int head_dim = 0, index_head_dim = 0;
  KvDtype dtype = KvDtype::kReference;
  bool bf16() const { return dtype == KvDtype::kBf16; }
  size_t window_bytes() const { return bf16() ? head_dim * 2 : head_dim + head_dim / 32; }
  size_t main_bytes() const { return bf16() ? head_dim * 2 : head_dim / 2 + head_dim / 16; }
  size_t index_bytes() const { return index_head_dim / 2 + index_head_dim / 32; }
};

struct KvOwnerState {
  int layer = -1;
  int ratio = 0;
  int64_t n_entries = 0;
  std::vector<uint8_t> main;        // [capacity, main_bytes]
  std::vector<uint8_t> index_keys;  // [capacity, index_bytes]
  std::vector<float> kv_state;      // [ratio, head_dim] pending group (ratio > 1)
  std::vector<float> score_state;   // [ratio, head_dim], -inf where empty
};

struct SequenceState {
  int64_t n_tokens = 0;                      // positions processed so far
  int64_t capacity = 0;                      // most positions this state can hold
  std::vector<int32_t> tokens;               // every token id processed, in order
  std::vector<std::vector<uint8_t>> window;  // [n_layers][window_size * window_bytes]
  std::vector<KvOwnerState> owners;          // one per KV owner layer
  std::vector<int> owner_of_layer;           // layer -> index into owners (-1 if not an owner)
  // The reference's shared index-key slot (SharedAttentionRuntime.index_k): the KV owner whose
  // index-key cache was published last. It persists across forward calls (spec §9.1).
  int index_key_slot = -1;
  EngramHistory engram;
  // Bounded replay after a prefix-cache hit (spec §8): window attention never reaches positions
  // below window_floor, and positions below replay_until only rebuild window KV (their compressed
  // KV, index keys and compressor state were restored, not recomputed).
  int64_t window_floor = 0;
  int64_t replay_until = 0;
  KvDtype kv_dtype = KvDtype::kReference;    // the entry format of window and main (KvEntryFormat)
  // A speculative verify pass in progress (sequence_journal.h): the forward hands it the compressor
  // rows it overwrites. Not owned; null otherwise.
  SequenceJournal* journal = nullptr;

  KvOwnerState& owner(int layer) { return owners[owner_of_layer[layer]]; }
};

// A fresh state for up to `capacity` positions; every buffer is allocated here, so the forward
// pass does not allocate per token.
SequenceState make_sequence_state(const ModelConfig& c, const LayerPlan& plan, int64_t capacity,
                                  KvDtype dtype = KvDtype::kReference);

// Bytes make_sequence_state allocates for `capacity` positions (what a server reserves per request),
// and the bytes a state holds (capacities of its buffers).
uint64_t sequence_state_bytes(const ModelConfig& c, const LayerPlan& plan, int64_t capacity,
                              KvDtype dtype = KvDtype::kReference);
uint64_t held_bytes(const SequenceState& s);

}  // namespace cedar::model
