// The residency planner: given a memory budget, decide what stays in RAM (dense weights always,
// then as many routed experts as fit in an expert slab, then a hot-row cache for Engram) and
// estimate what streams from the SSD. A pure function of the config, so `cedar inspect --config`
// plans for machines that do not hold the checkpoint.
//
// The byte estimates assume uniform routing and uniform Engram hashing (every expert and row equally
// likely). Real routing is skewed, so a frequency-ranked cache does better than the estimate;
// `cedar bench --memory-budget` measures the real figures.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "spec/config.h"
#include "spec/layer_plan.h"
#include "spec/weight_inventory.h"

namespace cedar::model {

struct ResidencyPlanOptions {
  uint64_t kv_reserve_bytes = 0;   // KV state the caller keeps beside the weights (serve --kv-memory)
  int prefill_chunk = 512;         // tokens per prefill chunk (each chunk reads its experts once)
  // Fast numerics (the commands' default) keep the head re-coded for the GEMV (ops/linear/bf16_coded.h).
  bool coded_head = true;
};

// Bytes of one routed expert as stored (w1, w2, w3 and their scales), and the slab slot that holds
// one: each of its tensors may need a 4 KiB-aligned superset for O_DIRECT.
int64_t routed_expert_bytes(const ModelConfig& c);
int64_t expert_slot_bytes(const ModelConfig& c);
// One Engram row (codes + scales) and the compact slot that caches it.
int64_t engram_row_bytes(const ModelConfig& c);
int64_t engram_slot_bytes(const ModelConfig& c);
// Device bytes a missed Engram row costs: the rows are read buffered, a page for its codes and a
// page for its scales.
inline constexpr int64_t kEngramMissDeviceBytes = 2 * 4096;

struct ResidencyPlan {
  uint64_t budget = 0;
  bool streaming = false;          // false: everything fits; weights are mapped and stay resident
  // Resident bytes by kind.
  int64_t dense_bytes = 0;         // backbone without routed experts and Engram tables
  int64_t kv_reserve_bytes = 0;
  int64_t workspace_reserve = 0;   // activations and scratch
  int64_t coded_head_bytes = 0;    // the head re-coded for the fast GEMV (anonymous, beside its mapping)
  int64_t expert_slab_bytes = 0;
  int64_t engram_cache_bytes = 0;
  // Totals on disk.
  int64_t routed_expert_total = 0; // bytes of every routed expert
  int64_t engram_table_total = 0;
  int64_t n_experts = 0;           // layers x routed experts per layer
  int64_t expert_slots = 0;        // experts resident at once
  int64_t expert_bytes = 0, expert_slot = 0;
  int64_t engram_rows_total = 0, engram_slots = 0, engram_rows_per_token = 0;
  // Estimates (uniform routing / hashing).
  double expert_hit = 1.0, engram_hit = 1.0;
  double ssd_bytes_per_decode_token = 0;
  double ssd_bytes_per_prefill_token = 0;
  int prefill_chunk = 0;
  int64_t resident_total() const {
    return dense_bytes + kv_reserve_bytes + workspace_reserve + coded_head_bytes + expert_slab_bytes +
           engram_cache_bytes;
  }
};

// Errors: FailedPrecondition when the budget cannot hold the dense weights plus the smallest
// streaming caches; the message names the smallest budget that works.
Result<ResidencyPlan> plan_residency(const ModelConfig& c, const LayerPlan& plan, const ParamCounts& counts,
                                     uint64_t budget, const ResidencyPlanOptions& options = {});
// A fully resident plan (no budget given).
ResidencyPlan resident_plan(const ModelConfig& c, const LayerPlan& plan, const ParamCounts& counts,
                            const ResidencyPlanOptions& options = {});

std::string residency_plan_text(const ResidencyPlan& p);
nlohmann::json residency_plan_json(const ResidencyPlan& p);

// Parses "64G", "512M", "1T", "1048576" (binary units). InvalidArgument names `flag`.
Result<uint64_t> parse_size(const std::string& text, const std::string& flag);
// What this machine can spare for weights: MemAvailable minus `reserve` (0 when unknown).
uint64_t default_memory_budget(uint64_t reserve);

}  // namespace cedar::model
