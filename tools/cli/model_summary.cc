#include "model_summary.h"

#include <cstdio>

namespace cedar::model {
namespace {

const char* candidate_name(CandidateRole r) {
  switch (r) {
    case CandidateRole::kNone: return "-";
    case CandidateRole::kBuildsPool: return "builds pool";
    case CandidateRole::kConsumer: return "consumer";
  }
  return "?";
}

std::string layer_ref(int l) { return l < 0 ? "-" : std::to_string(l); }

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

std::string billions(int64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
  return buf;
}

}  // namespace

KvEntrySizes kv_entry_sizes(const ModelConfig& c) {
  KvEntrySizes s;
  s.main_kv = c.head_dim / 2 + c.head_dim / 16;
  s.index_key = c.index_head_dim / 2 + c.index_head_dim / 32;
  s.window = c.head_dim + c.head_dim / 32;
  return s;
}

MemoryPlan memory_plan(const ModelConfig& c, const LayerPlan& plan, const ParamCounts& counts) {
  MemoryPlan m;
  m.weight_bytes = counts.total_bytes();
  m.routed_expert_bytes = counts.routed_expert_bytes;
  m.engram_table_bytes = counts.engram_bytes;
  m.dense_bytes = counts.backbone_bytes - counts.routed_expert_bytes;
  const int64_t per_expert = c.n_routed_experts ? counts.routed_expert_bytes / (c.n_routed_experts * c.n_layers) : 0;
  const int64_t engram_row = c.engram_head_dim + c.engram_head_dim / 32;
  const int64_t engram_rows_per_token =
      static_cast<int64_t>(c.engram_layer_ids.size()) * (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  // A decode step reads one embedding row, not the table.
  const int64_t embed_table = static_cast<int64_t>(c.vocab_size) * c.dim * 2;
  m.decode_bytes_per_token = m.dense_bytes - embed_table + c.dim * 2 + per_expert * c.n_activated_experts * c.n_layers +
                             engram_rows_per_token * engram_row;
  const KvEntrySizes e = kv_entry_sizes(c);
  // V4 entries use FlashMLA's layout (spec §5.3): E4M3 nope dims, bf16 RoPE dims, one E8M0 per 64
  // nope dims, one pad byte; only its ratio-4 (CSA) layers keep index keys.
  const int64_t v4_main = c.nope_head_dim() + 2 * c.rope_head_dim + c.nope_head_dim() / 64 + 1;
  for (int l : plan.kv_owner_layers) {
    const LayerPlanEntry& le = plan.layers[l];
    const double r = le.compress_ratio;
    if (c.family == ModelFamily::kV41) m.kv_global_bytes_per_token += (e.main_kv + e.index_key) / r;
    else m.kv_global_bytes_per_token += (v4_main + (le.mode == AttnMode::kCsa ? e.index_key : 0)) / r;
  }
  m.swa_bytes_per_sequence = static_cast<int64_t>(c.n_total_layers()) * c.window_size * e.window;
  return m;
}

nlohmann::json summary_json(const ModelConfig& c, const LayerPlan& plan, const ParamCounts& counts) {
  using nlohmann::json;
  json layers = json::array();
  for (const auto& e : plan.layers) {
    layers.push_back({
        {"layer", e.layer},
        {"dspark_stage", e.is_mtp ? e.layer - c.n_layers : -1},
        {"compress_ratio", e.compress_ratio},
        {"mode", attn_mode_name(e.mode)},
        {"kv_from", e.kv_from},
        {"index_keys_from", e.index_keys_from},
        {"topk_from", e.topk_from},
        {"candidate", candidate_name(e.candidate)},
        {"candidate_from", e.candidate_from},
        {"rope_theta", e.rope.theta},
        {"yarn", e.rope.yarn},
        {"engram", e.engram},
        {"dspark_target", e.dspark_target},
        {"encoder", !e.is_mtp && e.encoder},
        {"n_routed_experts", e.n_routed_experts},
        {"n_activated_experts", e.n_activated_experts},
    });
  }
  const MemoryPlan m = memory_plan(c, plan, counts);
  return {
      {"family", c.family == ModelFamily::kV41 ? "deepseek_v41" : "deepseek_v4"},
      {"architecture", c.architecture},
      {"config",
       {{"vocab_size", c.vocab_size}, {"dim", c.dim}, {"n_layers", c.n_layers}, {"n_mtp_layers", c.n_mtp_layers},
        {"n_heads", c.n_heads}, {"head_dim", c.head_dim}, {"rope_head_dim", c.rope_head_dim},
        {"q_lora_rank", c.q_lora_rank}, {"o_groups", c.o_groups}, {"o_lora_rank", c.o_lora_rank},
        {"n_routed_experts", c.n_routed_experts}, {"n_activated_experts", c.n_activated_experts},
        {"moe_inter_dim", c.moe_inter_dim}, {"window_size", c.window_size}, {"index_topk", c.index_topk},
        {"index_n_heads", c.index_n_heads}, {"index_head_dim", c.index_head_dim},
        {"candidate_topk_blocks", c.candidate_topk_blocks}, {"candidate_block_size", c.candidate_block_size},
        {"hc_mult", c.hc_mult}, {"norm_eps", c.norm_eps}, {"weight_block_size", c.weight_block_size},
        {"engram_layer_ids", c.engram_layer_ids}, {"engram_num_embeddings", c.engram_num_embeddings},
        {"vision",
         c.vision.present ? nlohmann::json{{"n_layers", c.vision.n_layers}, {"dim", c.vision.dim},
                                           {"n_heads", c.vision.n_heads}, {"inter_dim", c.vision.inter_dim},
                                           {"patch_size", c.vision.patch_size}, {"downsample", c.vision.downsample},
                                           {"max_n_token", c.vision.max_n_token}, {"min_pixels", c.vision.min_pixels},
                                           {"weight_bytes", counts.vision_bytes}}
                          : nlohmann::json(nullptr)}}},
      {"layers", layers},
      {"params",
       {{"backbone", counts.backbone}, {"engram", counts.engram}, {"dspark", counts.dspark},
        {"vision", counts.vision}, {"total", counts.total()}, {"routed_experts", counts.routed_expert_params},
        {"n_tensors", counts.n_tensors}}},
      {"memory",
       {{"weight_bytes", m.weight_bytes}, {"dense_bytes", m.dense_bytes},
        {"routed_expert_bytes", m.routed_expert_bytes}, {"engram_table_bytes", m.engram_table_bytes},
        {"decode_bytes_per_token", m.decode_bytes_per_token},
        {"kv_global_bytes_per_token", m.kv_global_bytes_per_token},
        {"swa_bytes_per_sequence", m.swa_bytes_per_sequence}}},
  };
}

std::string summary_text(const ModelConfig& c, const LayerPlan& plan, const ParamCounts& counts) {
  std::string out;
  char line[512];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    out += line;
  };
  add("model: %s (%s)\n", c.architecture.c_str(), c.family == ModelFamily::kV41 ? "DeepSeek-V4.1" : "DeepSeek-V4");
  add("  dim %d, %d layers + %d %s, %d heads x %d (rope %d), q_lora %d, o_groups %d x %d\n", c.dim, c.n_layers,
      c.n_mtp_layers, c.family == ModelFamily::kV41 ? "DSpark stages" : "MTP layers", c.n_heads, c.head_dim,
      c.rope_head_dim, c.q_lora_rank, c.o_groups, c.o_lora_rank);
  add("  MoE: %d routed experts (top-%d) + %d shared, width %d, %s, route scale %.2f\n", c.n_routed_experts,
      c.n_activated_experts, c.n_shared_experts, c.moe_inter_dim, c.score_func.c_str(), c.route_scale);
  add("  window %d, indexer %d heads x %d top-%d, candidate pool %d blocks x %d, hc_mult %d, eps %g\n",
      c.window_size, c.index_n_heads, c.index_head_dim, c.index_topk, c.candidate_topk_blocks,
      c.candidate_block_size, c.hc_mult, c.norm_eps);
  if (c.vision.present)
    add("  vision tower: %d layers x %d, %d heads, inter %d, %dx%d patches merged %dx%d, at most %d image tokens; "
        "%s of bf16 weights, read only when a prompt has images\n",
        c.vision.n_layers, c.vision.dim, c.vision.n_heads, c.vision.inter_dim, c.vision.patch_size,
        c.vision.patch_size, c.vision.downsample, c.vision.downsample, c.vision.max_n_token,
        human_bytes(static_cast<double>(counts.vision_bytes)).c_str());
  out += "\nlayer plan:\n";
  add("  %-6s %-5s %-7s %-7s %-9s %-6s %-12s %-9s %-4s %-7s %s\n", "layer", "ratio", "mode", "kv_from",
      "idx_keys", "topk", "candidates", "rope", "yarn", "experts", "notes");
  for (const auto& e : plan.layers) {
    std::string name = e.is_mtp ? "D" + std::to_string(e.layer - c.n_layers) : std::to_string(e.layer);
    std::string notes;
    if (e.engram) notes += "engram ";
    if (e.dspark_target) notes += "dspark-target ";
    if (e.hash_routed) notes += "hash-routed ";
    if (e.is_mtp) notes += c.family == ModelFamily::kV41 ? "DSpark stage " : "MTP ";
    else if (c.family == ModelFamily::kV41) notes += e.encoder ? "encoder" : "decoder";
    char experts[32];
    std::snprintf(experts, sizeof experts, "%d/%d", e.n_activated_experts, e.n_routed_experts);
    add("  %-6s %-5d %-7s %-7s %-9s %-6s %-12s %-9.0f %-4s %-7s %s\n", name.c_str(), e.compress_ratio,
        attn_mode_name(e.mode), layer_ref(e.kv_from).c_str(), layer_ref(e.index_keys_from).c_str(),
        layer_ref(e.topk_from).c_str(), candidate_name(e.candidate), e.rope.theta, e.rope.yarn ? "yes" : "no",
        experts, notes.c_str());
  }
  const MemoryPlan m = memory_plan(c, plan, counts);
  out += "\nparameters:\n";
  add("  backbone %s (routed experts %s), engram %s, dspark %s, vision %s, total %s in %lld tensors\n",
      billions(counts.backbone).c_str(), billions(counts.routed_expert_params).c_str(),
      billions(counts.engram).c_str(), billions(counts.dspark).c_str(), billions(counts.vision).c_str(),
      billions(counts.total()).c_str(), static_cast<long long>(counts.n_tensors));
  out += "\nmemory plan:\n";
  add("  weights on disk %s: dense %s, routed experts %s, engram tables %s\n", human_bytes(m.weight_bytes).c_str(),
      human_bytes(m.dense_bytes).c_str(), human_bytes(m.routed_expert_bytes).c_str(),
      human_bytes(m.engram_table_bytes).c_str());
  add("  read per decoded token (dense + %d experts/layer + Engram rows): %s\n", c.n_activated_experts,
      human_bytes(m.decode_bytes_per_token).c_str());
  add("  global KV %.1f B/token (1M tokens: %s), SWA rings %s per sequence\n",
      m.kv_global_bytes_per_token, human_bytes(m.kv_global_bytes_per_token * 1048576.0).c_str(),
      human_bytes(m.swa_bytes_per_sequence).c_str());
  return out;
}

}  // namespace cedar::model
