// ModelConfig: the model hyper-parameters, read from a Hugging Face config.json. Two layouts are
// accepted: the V4.1 release (nested `text_config` / `quantization_config` / `vision_config`) and the
// flat V4-Flash form. Field names follow the official reference's ModelArgs (inference/model.py) so a
// reviewer can diff them; the HF key each comes from is given in config.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace cedar::model {

enum class ModelFamily { kV41, kV4 };

struct VisionConfig {
  bool present = false;
  int n_layers = 0, dim = 0, n_heads = 0, inter_dim = 0, patch_size = 0, downsample = 0;
  int max_n_token = 0;
  int64_t min_pixels = 0;
  double rope_theta = 10000;
};

// The most draft positions per DSpark block cedar runs (the release drafts 5).
inline constexpr int kMaxDsparkBlockSize = 16;

struct ModelConfig {
  ModelFamily family = ModelFamily::kV41;
  std::string architecture;         // "DeepseekV41ForCausalLM"
  int vocab_size = 0;
  int dim = 0;                      // hidden_size
  int moe_inter_dim = 0;            // moe_intermediate_size
  int n_layers = 0;                 // backbone layers (num_hidden_layers)
  int n_mtp_layers = 0;             // DSpark stages (V4.1) or MTP layers (V4): num_nextn_predict_layers
  int n_hash_layers = 0;            // V4 only: token-id hash routed layers
  int n_heads = 0;                  // num_attention_heads (one shared KV head)
  int head_dim = 0;                 // 512
  int rope_head_dim = 0;            // qk_rope_head_dim (64)
  int q_lora_rank = 0;
  int o_lora_rank = 0;
  int o_groups = 0;
  int n_routed_experts = 0, n_shared_experts = 0, n_activated_experts = 0;
  std::string score_func;           // "sqrtsoftplus"
  double route_scale = 1.0;         // routed_scaling_factor
  double swiglu_limit = 0;
  double norm_eps = 1e-6;           // rms_norm_eps
  int window_size = 0;              // sliding_window
  int64_t max_position_embeddings = 0;
  // RoPE / YaRN.
  double rope_theta = 10000, compress_rope_theta = 160000;
  double rope_factor = 1, beta_fast = 32, beta_slow = 1;
  int64_t original_seq_len = 0;     // 0 = no YaRN
  // Compression (43 or 44 entries: backbone + MTP/DSpark).
  std::vector<int> compress_ratios;
  // CSA2 sharing (V4.1).
  std::vector<int> kv_source_layers, index_source_layers;
  int index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  int candidate_source_layer = -1, candidate_topk_blocks = 0, candidate_block_size = 0;
  // Hyper-connections.
  int hc_mult = 0, hc_sinkhorn_iters = 0;
  double hc_eps = 0;
  // Engram.
  std::vector<int> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;
  int engram_max_ngram_size = 0, engram_n_heads = 0, engram_head_dim = 0;
  int64_t engram_vocab_size = 0;
  int engram_pad_id = 0, engram_compressed_vocab_size = 0;
  // DSpark (docs/DSPARK.md); dspark_block_size <= kMaxDsparkBlockSize.
  int dspark_block_size = 0, dspark_noise_token_id = 0, dspark_markov_rank = 0;
  std::vector<int> dspark_target_layer_ids;
  int dspark_n_routed_experts = 0, dspark_n_activated_experts = 0;
  // Quantisation.
  int weight_block_size = 128;      // quantization_config.weight_block_size (square)
  std::string expert_dtype = "fp4";
  // Special ids.
  int bos_token_id = 0, eos_token_id = 1, pad_token_id = 2, image_token_id = -1;
  VisionConfig vision;

  int n_total_layers() const { return n_layers + n_mtp_layers; }
  int nope_head_dim() const { return head_dim - rope_head_dim; }
};

// Parses config.json text (either layout) and validates it; errors name the offending field.
Result<ModelConfig> parse_config(const std::string& json_text);
Result<ModelConfig> load_config(const std::string& path);
// Cross-field checks (ratios count, source ids in range and consistent, ...). parse_config calls it.
Status validate_config(const ModelConfig& c);
// The V4.1 nested HF form of `c` (what make-tiny writes as config.json).
std::string config_to_hf_json(const ModelConfig& c);

}  // namespace cedar::model
