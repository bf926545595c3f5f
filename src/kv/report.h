// KV footprint measurement for `cedar kv-report`: builds the real cache structures (KvCache with a pool
// sized for the context, one sequence holding the whole context) and reads every figure off what was
// allocated. The pool and the window ring are anonymous mappings that are never touched, so a
// million-token cache costs address space, not memory.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "kv/geometry.h"

namespace cedar::kv {

struct KvFootprint {
  std::string model;
  KvFamily family = KvFamily::kV41;
  int64_t context_tokens = 0;
  uint32_t block_tokens = 0;
  uint64_t blocks_allocated = 0;
  int kv_owner_layers = 0;
  // Global KV allocated for the context, by component.
  uint64_t main_kv_bytes = 0;
  uint64_t index_key_bytes = 0;
  uint64_t global_bytes = 0;
  double main_kv_bytes_per_token = 0;
  double index_key_bytes_per_token = 0;
  double global_bytes_per_token = 0;
  // Per-sequence state outside the pool.
  int window_layers = 0;
  int backbone_window_layers = 0;
  uint64_t swa_bytes_per_sequence = 0;           // every windowed layer (backbone + draft stages)
  uint64_t swa_backbone_bytes_per_sequence = 0;  // backbone layers only
  uint64_t compressor_tail_bytes_per_sequence = 0;
  uint64_t engram_history_bytes_per_sequence = 0;
  uint64_t boundary_state_bytes_per_block = 0;
  // Disk: one block file as cedar writes it (header + token ids + boundary state + KV, uncompressed).
  uint64_t block_file_bytes = 0;
  bool persists_swa = false;                    // this model's scheme saves SWA with a prefix (V4 does)
  double persisted_bytes_per_token_without_swa = 0;  // block_file_bytes / block_tokens
  double persisted_bytes_per_token_with_swa = 0;     // + one sequence's SWA per context
  double persisted_bytes_per_token = 0;              // the one of the two this model's scheme uses
  uint64_t reserved_bytes = 0;                  // address space reserved by the measurement
};

// Allocates the cache for `context_tokens` tokens of one sequence and measures it. `persists_swa`
// selects which persisted figure is the model's own.
Result<KvFootprint> measure_footprint(const CacheGeometry& geometry, int64_t context_tokens, bool persists_swa);

// {"model", "global_bytes_per_token", "swa_bytes_per_sequence", "persisted_bytes_per_token", ...}.
nlohmann::json footprint_to_json(const KvFootprint& f);

}  // namespace cedar::kv
