// Derives the per-layer attention plan. V4.1 wiring mirrors how the reference's layers hand state
// down the stack (SharedAttentionRuntime in model.py): a KV source publishes compressed KV and index
// keys, an index source publishes its top-k, and every later layer reads the most recent of each.
#include "spec/layer_plan.h"

#include <algorithm>

namespace cedar::model {
namespace {

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

RopeSpec rope_for_ratio(const ModelConfig& c, int ratio) {
  // Pure sliding-window layers (and DSpark/MTP stages) use the base theta without YaRN.
  if (ratio == 0) return {c.rope_theta, false};
  return {c.compress_rope_theta, c.original_seq_len > 0};
}

void plan_v41_backbone(const ModelConfig& c, LayerPlan& plan) {
  int kv_src = -1, idx_src = -1;
  for (int l = 0; l < c.n_layers; ++l) {
    LayerPlanEntry& e = plan.layers[l];
    e.compress_ratio = c.compress_ratios[l];
    e.rope = rope_for_ratio(c, e.compress_ratio);
    e.encoder = c.candidate_source_layer >= 0 ? l < c.candidate_source_layer : true;
    if (e.compress_ratio == 0) continue;
    const bool kv_source = contains(c.kv_source_layers, l);
    const bool index_source = contains(c.index_source_layers, l);
    if (kv_source) {
      kv_src = l;
      plan.kv_owner_layers.push_back(l);
    }
    if (index_source) idx_src = l;
    e.kv_from = kv_src;
    e.topk_from = idx_src;
    if (kv_source) {
      e.mode = AttnMode::kFull;
      e.index_keys_from = l;
    } else if (index_source) {
      e.mode = AttnMode::kReindex;
      e.index_keys_from = kv_src;  // the most recently published index keys
    } else {
      e.mode = AttnMode::kReuse;
    }
    if (index_source && l == c.candidate_source_layer) {
      e.candidate = CandidateRole::kBuildsPool;
    } else if (index_source && c.candidate_source_layer >= 0 && c.candidate_source_layer < l) {
      e.candidate = CandidateRole::kConsumer;
      e.candidate_from = c.candidate_source_layer;
    }
  }
}

void plan_v4_backbone(const ModelConfig& c, LayerPlan& plan) {
  for (int l = 0; l < c.n_layers; ++l) {
    LayerPlanEntry& e = plan.layers[l];
    e.compress_ratio = c.compress_ratios[l];
    e.rope = rope_for_ratio(c, e.compress_ratio);
    e.hash_routed = l < c.n_hash_layers;
    if (e.compress_ratio == 0) continue;
    // Every compressed V4 layer owns its compressor; ratio 4 (CSA) also owns an indexer.
    e.kv_from = l;
    plan.kv_owner_layers.push_back(l);
    if (e.compress_ratio == 4) {
      e.mode = AttnMode::kCsa;
      e.index_keys_from = l;
      e.topk_from = l;
    } else {
      e.mode = AttnMode::kHca;
    }
  }
}

}  // namespace

LayerPlan make_layer_plan(const ModelConfig& c) {
  LayerPlan plan;
  plan.layers.resize(c.n_total_layers());
  for (int l = 0; l < c.n_total_layers(); ++l) {
    LayerPlanEntry& e = plan.layers[l];
    e.layer = l;
    e.is_mtp = l >= c.n_layers;
    e.n_routed_experts = c.n_routed_experts;
    e.n_activated_experts = c.n_activated_experts;
  }
  if (c.family == ModelFamily::kV41) plan_v41_backbone(c, plan);
  else plan_v4_backbone(c, plan);

  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) {
    plan.layers[c.engram_layer_ids[i]].engram = true;
    plan.layers[c.engram_layer_ids[i]].engram_index = static_cast<int>(i);
  }
  for (int l : c.dspark_target_layer_ids) plan.layers[l].dspark_target = true;
  for (int l = c.n_layers; l < c.n_total_layers(); ++l) {
    LayerPlanEntry& e = plan.layers[l];
    e.compress_ratio = c.compress_ratios[l];
    e.rope = rope_for_ratio(c, 0);
    // DSpark stages use their own (smaller) expert set when the config gives one.
    if (c.dspark_n_routed_experts > 0) e.n_routed_experts = c.dspark_n_routed_experts;
    if (c.dspark_n_activated_experts > 0) e.n_activated_experts = c.dspark_n_activated_experts;
  }
  return plan;
}

const char* attn_mode_name(AttnMode m) {
  switch (m) {
    case AttnMode::kSwa: return "SWA";
    case AttnMode::kFull: return "Full";
    case AttnMode::kReindex: return "Reindex";
    case AttnMode::kReuse: return "Reuse";
    case AttnMode::kCsa: return "CSA";
    case AttnMode::kHca: return "HCA";
  }
  return "?";
}

}  // namespace cedar::model
