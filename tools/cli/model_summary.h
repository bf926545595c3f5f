// What `cedar inspect` reports about a model: config summary, the layer plan table, parameter
// counts and the memory plan, as text or JSON. Derived from ModelConfig + LayerPlan + inventory only.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "spec/config.h"
#include "spec/layer_plan.h"
#include "spec/weight_inventory.h"

namespace cedar::model {

// Packed sizes of one cache entry (spec §5.1), from the head geometry.
struct KvEntrySizes {
  int64_t main_kv = 0;    // V4.1: head_dim E2M1 + head_dim/16 E4M3 scales (288 B released)
  int64_t index_key = 0;  // index_head_dim E2M1 + index_head_dim/32 E8M0 (68 B released)
  int64_t window = 0;     // head_dim E4M3 + head_dim/32 E8M0 (528 B released)
};
KvEntrySizes kv_entry_sizes(const ModelConfig& c);

struct MemoryPlan {
  int64_t weight_bytes = 0;            // everything on disk
  int64_t dense_bytes = 0;             // backbone without routed experts (read every token)
  int64_t routed_expert_bytes = 0;     // all routed experts
  int64_t engram_table_bytes = 0;
  int64_t decode_bytes_per_token = 0;  // dense + activated experts + Engram rows touched
  double kv_global_bytes_per_token = 0;  // compressed main KV + index keys of every KV owner
  int64_t swa_bytes_per_sequence = 0;  // every layer's 128-slot ring (backbone + DSpark)
};
MemoryPlan memory_plan(const ModelConfig& c, const LayerPlan& plan, const ParamCounts& counts);

nlohmann::json summary_json(const ModelConfig& c, const LayerPlan& plan, const ParamCounts& counts);
std::string summary_text(const ModelConfig& c, const LayerPlan& plan, const ParamCounts& counts);

}  // namespace cedar::model
