// WeightSource: the one interface through which the forward pass obtains routed experts and Engram
// table rows. It hides whether they are resident (mapped checkpoint) or streamed from the SSD into a
// bounded cache (weights/streaming_source.h); the forward pass only says what it will need, as early
// as it knows, and asks for the bytes when it computes.
//
// Contract for experts, per MoE layer: will_need(layer, ids) once the router has chosen (ids
// ascending, distinct); then for groups of at most max_held() of those ids, get() each and
// release_all() after the group's GEMMs. hint() names experts a later layer will probably choose
// (look-ahead); it may be ignored. For Engram: will_need_rows() with every row id of the new tokens
// before the first layer, gather_rows() at the Engram layer.
//
// Errors while streaming (an I/O error) are sticky: error() reports them after the step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/status.h"
#include "weights/model_weights.h"

namespace cedar::model {

struct ResidencyStats {
  uint64_t expert_hits = 0, expert_misses = 0, expert_prefetches = 0, expert_prefetch_used = 0;
  uint64_t expert_bytes = 0;    // read from the SSD
  uint64_t engram_hits = 0, engram_misses = 0, engram_bytes = 0;
  uint64_t max_reads_per_expert = 0;  // since reset_stats(): the most reads any one expert needed
  double io_wait_seconds = 0;   // time the forward pass spent in the source: issuing and waiting for reads
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  virtual bool streaming() const = 0;
  virtual size_t max_held() const = 0;
  virtual void will_need(int layer, std::span<const int32_t> experts) = 0;
  virtual void hint(int layer, std::span<const int32_t> experts) = 0;
  virtual ExpertWeights get(int layer, int expert) = 0;
  virtual void release_all() = 0;

  // rows: [n_tokens, n_engram_layers * n_columns] global row ids of each Engram layer's table.
  virtual void will_need_rows(std::span<const int64_t> rows, size_t per_token, size_t n_columns) = 0;
  // Copies the codes [rows.size(), head_dim] and scales [rows.size(), head_dim / 32] of `rows` of the
  // table of Engram layer `engram_index` into codes / scales. Row ids are checked by the caller.
  virtual void gather_rows(int engram_index, std::span<const int64_t> rows, uint8_t* codes, uint8_t* scales) = 0;

  virtual Status error() const { return {}; }
  virtual ResidencyStats stats() const { return {}; }
  virtual void reset_stats() {}
  // Persists routing statistics so that the next start is warm (no-op when resident).
  virtual Status save_stats() { return {}; }
};

// Everything resident: views into the mapped checkpoint (the ModelWeights already bound).
std::unique_ptr<WeightSource> make_mapped_source(const ModelWeights& weights, int engram_head_dim);

}  // namespace cedar::model
