// Reading and validating config.json. Keys are the Hugging Face names (V4.1 nested under
// text_config, V4-Flash flat); each is mapped to the reference's ModelArgs name in ModelConfig.
#include "spec/config.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "spec/engram_layout.h"

namespace cedar::model {
namespace {

using nlohmann::json;

// Typed field access that turns every JSON type error into a Status naming the key.
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  template <typename T>
  Status required(const char* key, T* out) const {
    if (!obj_.contains(key)) return invalid_argument(where_ + ": missing required field '" + key + "'");
    return get(key, out);
  }
  template <typename T>
  Status optional(const char* key, T* out) const {
    if (!obj_.contains(key) || obj_.at(key).is_null()) return {};
    return get(key, out);
  }
  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const json& at(const char* key) const { return obj_.at(key); }

 private:
  template <typename T>
  Status get(const char* key, T* out) const {
    const json& v = obj_.at(key);
    try {
      if constexpr (std::is_same_v<T, std::string>) {
        if (!v.is_string()) return type_error(key, "a string");
        *out = v.get<std::string>();
      } else if constexpr (std::is_same_v<T, double>) {
        if (!v.is_number()) return type_error(key, "a number");
        *out = v.get<double>();
      } else if constexpr (std::is_integral_v<T>) {
        if (!v.is_number_integer()) return type_error(key, "an integer");
        long long x = v.get<long long>();
        if (x < 0 && std::is_same_v<T, int> && key != std::string("candidate_source_layer_id"))
          return invalid_argument(where_ + ": field '" + key + "' must not be negative, got " +
                                  std::to_string(x));
        if (x > static_cast<long long>(std::numeric_limits<T>::max()))
          return invalid_argument(where_ + ": field '" + key + "' is too large: " + std::to_string(x));
        *out = static_cast<T>(x);
      } else {  // std::vector<int> / std::vector<int64_t>
        if (!v.is_array()) return type_error(key, "an array of integers");
        out->clear();
        for (const auto& e : v) {
          if (!e.is_number_integer()) return type_error(key, "an array of integers");
          out->push_back(static_cast<typename T::value_type>(e.get<long long>()));
        }
      }
    } catch (const json::exception& e) {
      return invalid_argument(where_ + ": field '" + key + "': " + e.what());
    }
    return {};
  }
  Status type_error(const char* key, const char* want) const {
    return invalid_argument(where_ + ": field '" + key + "' must be " + want + ", got " +
                            obj_.at(key).dump());
  }

  const json& obj_;
  std::string where_;
};

Status read_text_fields(const Fields& f, ModelConfig& c) {
  CEDAR_RETURN_IF_ERROR(f.required("vocab_size", &c.vocab_size));
  CEDAR_RETURN_IF_ERROR(f.required("hidden_size", &c.dim));
  CEDAR_RETURN_IF_ERROR(f.required("moe_intermediate_size", &c.moe_inter_dim));
  CEDAR_RETURN_IF_ERROR(f.required("num_hidden_layers", &c.n_layers));
  CEDAR_RETURN_IF_ERROR(f.optional("num_nextn_predict_layers", &c.n_mtp_layers));
  CEDAR_RETURN_IF_ERROR(f.optional("num_hash_layers", &c.n_hash_layers));
  CEDAR_RETURN_IF_ERROR(f.required("num_attention_heads", &c.n_heads));
  CEDAR_RETURN_IF_ERROR(f.required("head_dim", &c.head_dim));
  CEDAR_RETURN_IF_ERROR(f.required("qk_rope_head_dim", &c.rope_head_dim));
  CEDAR_RETURN_IF_ERROR(f.required("q_lora_rank", &c.q_lora_rank));
  CEDAR_RETURN_IF_ERROR(f.required("o_lora_rank", &c.o_lora_rank));
  CEDAR_RETURN_IF_ERROR(f.required("o_groups", &c.o_groups));
  CEDAR_RETURN_IF_ERROR(f.required("n_routed_experts", &c.n_routed_experts));
  CEDAR_RETURN_IF_ERROR(f.required("n_shared_experts", &c.n_shared_experts));
  CEDAR_RETURN_IF_ERROR(f.required("num_experts_per_tok", &c.n_activated_experts));
  CEDAR_RETURN_IF_ERROR(f.required("scoring_func", &c.score_func));
  CEDAR_RETURN_IF_ERROR(f.optional("routed_scaling_factor", &c.route_scale));
  CEDAR_RETURN_IF_ERROR(f.optional("swiglu_limit", &c.swiglu_limit));
  CEDAR_RETURN_IF_ERROR(f.required("rms_norm_eps", &c.norm_eps));
  CEDAR_RETURN_IF_ERROR(f.required("sliding_window", &c.window_size));
  CEDAR_RETURN_IF_ERROR(f.optional("max_position_embeddings", &c.max_position_embeddings));
  CEDAR_RETURN_IF_ERROR(f.optional("rope_theta", &c.rope_theta));
  CEDAR_RETURN_IF_ERROR(f.optional("compress_rope_theta", &c.compress_rope_theta));
  if (f.has("rope_scaling")) {
    const json& rs = f.at("rope_scaling");
    if (!rs.is_object()) return invalid_argument("config: field 'rope_scaling' must be an object");
    Fields r(rs, "config: rope_scaling");
    std::string type;
    if (rs.contains("rope_type")) CEDAR_RETURN_IF_ERROR(r.required("rope_type", &type));
    else CEDAR_RETURN_IF_ERROR(r.optional("type", &type));
    if (type != "yarn")
      return unimplemented("config: rope_scaling type '" + type + "' is not supported (expected 'yarn')");
    CEDAR_RETURN_IF_ERROR(r.required("factor", &c.rope_factor));
    CEDAR_RETURN_IF_ERROR(r.optional("beta_fast", &c.beta_fast));
    CEDAR_RETURN_IF_ERROR(r.optional("beta_slow", &c.beta_slow));
    CEDAR_RETURN_IF_ERROR(r.required("original_max_position_embeddings", &c.original_seq_len));
  }
  CEDAR_RETURN_IF_ERROR(f.required("compress_ratios", &c.compress_ratios));
  CEDAR_RETURN_IF_ERROR(f.optional("index_n_heads", &c.index_n_heads));
  CEDAR_RETURN_IF_ERROR(f.optional("index_head_dim", &c.index_head_dim));
  CEDAR_RETURN_IF_ERROR(f.optional("index_topk", &c.index_topk));
  CEDAR_RETURN_IF_ERROR(f.required("hc_mult", &c.hc_mult));
  CEDAR_RETURN_IF_ERROR(f.required("hc_sinkhorn_iters", &c.hc_sinkhorn_iters));
  CEDAR_RETURN_IF_ERROR(f.required("hc_eps", &c.hc_eps));
  CEDAR_RETURN_IF_ERROR(f.optional("bos_token_id", &c.bos_token_id));
  CEDAR_RETURN_IF_ERROR(f.optional("eos_token_id", &c.eos_token_id));
  CEDAR_RETURN_IF_ERROR(f.optional("pad_token_id", &c.pad_token_id));
  CEDAR_RETURN_IF_ERROR(f.optional("expert_dtype", &c.expert_dtype));
  if (c.family == ModelFamily::kV4) return {};

  // V4.1 only: CSA2 sharing, candidate pool, Engram, DSpark.
  CEDAR_RETURN_IF_ERROR(f.required("kv_source_layer_ids", &c.kv_source_layers));
  CEDAR_RETURN_IF_ERROR(f.required("index_source_layer_ids", &c.index_source_layers));
  c.candidate_source_layer = -1;
  if (f.has("candidate_source_layer_id")) {
    long long v = 0;
    CEDAR_RETURN_IF_ERROR(f.required("candidate_source_layer_id", &v));
    c.candidate_source_layer = static_cast<int>(v);
  }
  CEDAR_RETURN_IF_ERROR(f.optional("candidate_topk_blocks", &c.candidate_topk_blocks));
  CEDAR_RETURN_IF_ERROR(f.optional("candidate_block_size", &c.candidate_block_size));
  CEDAR_RETURN_IF_ERROR(f.optional("engram_layer_ids", &c.engram_layer_ids));
  CEDAR_RETURN_IF_ERROR(f.optional("engram_num_embeddings", &c.engram_num_embeddings));
  CEDAR_RETURN_IF_ERROR(f.optional("engram_max_ngram_size", &c.engram_max_ngram_size));
  CEDAR_RETURN_IF_ERROR(f.optional("engram_vocab_size", &c.engram_vocab_size));
  CEDAR_RETURN_IF_ERROR(f.optional("engram_n_heads", &c.engram_n_heads));
  CEDAR_RETURN_IF_ERROR(f.optional("engram_head_dim", &c.engram_head_dim));
  CEDAR_RETURN_IF_ERROR(f.optional("engram_pad_token_id", &c.engram_pad_id));
  CEDAR_RETURN_IF_ERROR(f.optional("engram_compressed_vocab_size", &c.engram_compressed_vocab_size));
  CEDAR_RETURN_IF_ERROR(f.optional("dspark_block_size", &c.dspark_block_size));
  CEDAR_RETURN_IF_ERROR(f.optional("dspark_noise_token_id", &c.dspark_noise_token_id));
  CEDAR_RETURN_IF_ERROR(f.optional("dspark_target_layer_ids", &c.dspark_target_layer_ids));
  CEDAR_RETURN_IF_ERROR(f.optional("dspark_markov_rank", &c.dspark_markov_rank));
  CEDAR_RETURN_IF_ERROR(f.optional("dspark_n_routed_experts", &c.dspark_n_routed_experts));
  CEDAR_RETURN_IF_ERROR(f.optional("dspark_num_experts_per_tok", &c.dspark_n_activated_experts));
  return {};
}

Status read_quantization(const json& q, ModelConfig& c) {
  if (!q.is_object()) return invalid_argument("config: 'quantization_config' must be an object");
  Fields f(q, "config: quantization_config");
  std::string method;
  CEDAR_RETURN_IF_ERROR(f.required("quant_method", &method));
  if (method != "fp8")
    return unimplemented("config: quantization_config.quant_method '" + method +
                         "' is not supported (cedar loads the released fp8/fp4 checkpoint)");
  std::vector<int> block;
  CEDAR_RETURN_IF_ERROR(f.required("weight_block_size", &block));
  if (block.size() != 2 || block[0] != block[1] || block[0] <= 0)
    return invalid_argument("config: quantization_config.weight_block_size must be [b, b], b > 0");
  c.weight_block_size = block[0];
  CEDAR_RETURN_IF_ERROR(f.optional("expert_dtype", &c.expert_dtype));
  return {};
}

Status read_vision(const json& v, VisionConfig& vc) {
  if (!v.is_object()) return invalid_argument("config: 'vision_config' must be an object");
  Fields f(v, "config: vision_config");
  vc.present = true;
  CEDAR_RETURN_IF_ERROR(f.required("num_hidden_layers", &vc.n_layers));
  CEDAR_RETURN_IF_ERROR(f.required("hidden_size", &vc.dim));
  CEDAR_RETURN_IF_ERROR(f.required("num_attention_heads", &vc.n_heads));
  CEDAR_RETURN_IF_ERROR(f.required("intermediate_size", &vc.inter_dim));
  CEDAR_RETURN_IF_ERROR(f.required("patch_size", &vc.patch_size));
  CEDAR_RETURN_IF_ERROR(f.optional("downsample_ratio", &vc.downsample));
  CEDAR_RETURN_IF_ERROR(f.optional("max_image_tokens", &vc.max_n_token));
  CEDAR_RETURN_IF_ERROR(f.optional("min_pixels", &vc.min_pixels));
  CEDAR_RETURN_IF_ERROR(f.optional("rope_theta", &vc.rope_theta));
  return {};
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

Status check_layer_ids(const std::vector<int>& ids, const char* field, int n_layers) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= n_layers)
      return invalid_argument(std::string("config: ") + field + "[" + std::to_string(i) + "] = " +
                              std::to_string(ids[i]) + " is not a backbone layer (0.." +
                              std::to_string(n_layers - 1) + ")");
    if (i > 0 && ids[i] <= ids[i - 1])
      return invalid_argument(std::string("config: ") + field + " must be strictly ascending");
  }
  return {};
}

Status positive(int v, const char* field) {
  if (v <= 0) return invalid_argument(std::string("config: field '") + field + "' must be > 0, got " + std::to_string(v));
  return {};
}

}  // namespace

Status validate_config(const ModelConfig& c) {
  CEDAR_RETURN_IF_ERROR(positive(c.vocab_size, "vocab_size"));
  CEDAR_RETURN_IF_ERROR(positive(c.dim, "hidden_size"));
  CEDAR_RETURN_IF_ERROR(positive(c.moe_inter_dim, "moe_intermediate_size"));
  CEDAR_RETURN_IF_ERROR(positive(c.n_layers, "num_hidden_layers"));
  CEDAR_RETURN_IF_ERROR(positive(c.n_heads, "num_attention_heads"));
  CEDAR_RETURN_IF_ERROR(positive(c.head_dim, "head_dim"));
  CEDAR_RETURN_IF_ERROR(positive(c.rope_head_dim, "qk_rope_head_dim"));
  CEDAR_RETURN_IF_ERROR(positive(c.q_lora_rank, "q_lora_rank"));
  CEDAR_RETURN_IF_ERROR(positive(c.o_lora_rank, "o_lora_rank"));
  CEDAR_RETURN_IF_ERROR(positive(c.o_groups, "o_groups"));
  CEDAR_RETURN_IF_ERROR(positive(c.n_routed_experts, "n_routed_experts"));
  CEDAR_RETURN_IF_ERROR(positive(c.n_activated_experts, "num_experts_per_tok"));
  CEDAR_RETURN_IF_ERROR(positive(c.window_size, "sliding_window"));
  CEDAR_RETURN_IF_ERROR(positive(c.hc_mult, "hc_mult"));
  if (c.rope_head_dim % 2 || c.rope_head_dim >= c.head_dim)
    return invalid_argument("config: qk_rope_head_dim must be even and smaller than head_dim");
  if (c.n_heads % c.o_groups)
    return invalid_argument("config: num_attention_heads (" + std::to_string(c.n_heads) +
                            ") must be a multiple of o_groups (" + std::to_string(c.o_groups) + ")");
  // wo_a is an FP8 weight with 32x32 scale blocks read one o_group at a time: each group's rows and
  // columns must start on a scale block.
  if (c.o_lora_rank % 32 || (c.n_heads * c.head_dim / c.o_groups) % 32)
    return invalid_argument("config: o_lora_rank (" + std::to_string(c.o_lora_rank) +
                            ") and num_attention_heads * head_dim / o_groups must be multiples of 32 (wo_a's "
                            "FP8 scale blocks)");
  if (c.n_activated_experts > c.n_routed_experts)
    return invalid_argument("config: num_experts_per_tok exceeds n_routed_experts");
  if (c.n_shared_experts != 1)
    return unimplemented("config: n_shared_experts must be 1 (the reference asserts it), got " +
                         std::to_string(c.n_shared_experts));
  if (c.score_func != "sqrtsoftplus" && c.score_func != "sigmoid" && c.score_func != "softmax")
    return invalid_argument("config: scoring_func '" + c.score_func + "' is unknown");
  if (c.norm_eps <= 0) return invalid_argument("config: rms_norm_eps must be > 0");
  const size_t want = static_cast<size_t>(c.n_layers + c.n_mtp_layers);
  if (c.compress_ratios.size() != want)
    return invalid_argument("config: compress_ratios has " + std::to_string(c.compress_ratios.size()) +
                            " entries but num_hidden_layers + num_nextn_predict_layers = " +
                            std::to_string(want));
  const std::set<int> allowed = c.family == ModelFamily::kV41 ? std::set<int>{0, 1, 2}
                                                              : std::set<int>{0, 4, 128};
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    int r = c.compress_ratios[i];
    if (!allowed.count(r))
      return invalid_argument("config: compress_ratios[" + std::to_string(i) + "] = " + std::to_string(r) +
                              " is not a ratio this model family uses");
    if (static_cast<int>(i) >= c.n_layers && r != 0 && c.family == ModelFamily::kV41)
      return invalid_argument("config: compress_ratios[" + std::to_string(i) +
                              "] belongs to a DSpark stage and must be 0");
  }
  bool any_compressed = std::any_of(c.compress_ratios.begin(), c.compress_ratios.end(), [](int r) { return r > 0; });
  if (any_compressed) {
    CEDAR_RETURN_IF_ERROR(positive(c.index_n_heads, "index_n_heads"));
    CEDAR_RETURN_IF_ERROR(positive(c.index_head_dim, "index_head_dim"));
    CEDAR_RETURN_IF_ERROR(positive(c.index_topk, "index_topk"));
    if (c.index_head_dim <= c.rope_head_dim)
      return invalid_argument("config: index_head_dim must exceed qk_rope_head_dim");
  }
  if (c.family == ModelFamily::kV4) return {};

  CEDAR_RETURN_IF_ERROR(check_layer_ids(c.kv_source_layers, "kv_source_layer_ids", c.n_layers));
  CEDAR_RETURN_IF_ERROR(check_layer_ids(c.index_source_layers, "index_source_layer_ids", c.n_layers));
  for (int l : c.kv_source_layers) {
    if (c.compress_ratios[l] == 0)
      return invalid_argument("config: kv_source_layer_ids lists layer " + std::to_string(l) +
                              " whose compress_ratio is 0");
    if (!contains(c.index_source_layers, l))
      return invalid_argument("config: kv source layer " + std::to_string(l) +
                              " must also be in index_source_layer_ids (it publishes index keys)");
  }
  for (int l : c.index_source_layers)
    if (c.compress_ratios[l] == 0)
      return invalid_argument("config: index_source_layer_ids lists layer " + std::to_string(l) +
                              " whose compress_ratio is 0");
  // Every compressed layer reads the KV of the most recent source; that source must share its ratio.
  int last_src = -1;
  for (int l = 0; l < c.n_layers; ++l) {
    if (contains(c.kv_source_layers, l)) last_src = l;
    if (c.compress_ratios[l] == 0) continue;
    if (last_src < 0)
      return invalid_argument("config: layer " + std::to_string(l) +
                              " is compressed but no kv_source_layer_ids entry precedes it");
    if (c.compress_ratios[last_src] != c.compress_ratios[l])
      return invalid_argument("config: layer " + std::to_string(l) + " has compress_ratio " +
                              std::to_string(c.compress_ratios[l]) + " but its KV source layer " +
                              std::to_string(last_src) + " has " + std::to_string(c.compress_ratios[last_src]));
  }
  if (c.candidate_source_layer >= 0) {
    if (!contains(c.index_source_layers, c.candidate_source_layer))
      return invalid_argument("config: candidate_source_layer_id " + std::to_string(c.candidate_source_layer) +
                              " must be an index source layer");
    CEDAR_RETURN_IF_ERROR(positive(c.candidate_topk_blocks, "candidate_topk_blocks"));
    CEDAR_RETURN_IF_ERROR(positive(c.candidate_block_size, "candidate_block_size"));
  }
  CEDAR_RETURN_IF_ERROR(check_layer_ids(c.engram_layer_ids, "engram_layer_ids", c.n_layers));
  if (!c.engram_layer_ids.empty()) {
    if (c.engram_num_embeddings.size() != c.engram_layer_ids.size())
      return invalid_argument("config: engram_num_embeddings needs one entry per engram_layer_ids entry");
    if (c.engram_max_ngram_size < 2)
      return invalid_argument("config: engram_max_ngram_size must be >= 2");
    CEDAR_RETURN_IF_ERROR(positive(c.engram_n_heads, "engram_n_heads"));
    CEDAR_RETURN_IF_ERROR(positive(c.engram_head_dim, "engram_head_dim"));
    CEDAR_RETURN_IF_ERROR(positive(c.engram_compressed_vocab_size, "engram_compressed_vocab_size"));
    if (c.engram_vocab_size <= 0) return invalid_argument("config: engram_vocab_size must be > 0");
    if (c.engram_head_dim % 32)
      return invalid_argument("config: engram_head_dim must be a multiple of 32 (one E8M0 scale per 32)");
    // Table rows are the sum of each layer's prime bucket sizes; a mismatch would rehash everything.
    const EngramLayout layout = make_engram_layout(c);
    for (size_t i = 0; i < layout.rows.size(); ++i)
      if (layout.rows[i] != c.engram_num_embeddings[i])
        return invalid_argument("config: engram_num_embeddings[" + std::to_string(i) + "] = " +
                                std::to_string(c.engram_num_embeddings[i]) +
                                " but the prime bucket layout from engram_vocab_size gives " +
                                std::to_string(layout.rows[i]));
  }
  CEDAR_RETURN_IF_ERROR(check_layer_ids(c.dspark_target_layer_ids, "dspark_target_layer_ids", c.n_layers));
  if (c.n_mtp_layers > 0 && c.dspark_block_size > 0 && c.dspark_target_layer_ids.empty())
    return invalid_argument("config: DSpark stages need dspark_target_layer_ids");
  if (c.dspark_n_activated_experts > c.dspark_n_routed_experts)
    return invalid_argument("config: dspark_num_experts_per_tok exceeds dspark_n_routed_experts");
  if (c.family == ModelFamily::kV41 && c.n_mtp_layers > 0 && c.dspark_block_size > 0) {
    // The draft forward (docs/DSPARK.md) embeds the noise id and keeps per-block buffers on the stack.
    if (c.dspark_block_size > kMaxDsparkBlockSize)
      return invalid_argument("config: dspark_block_size " + std::to_string(c.dspark_block_size) +
                              " is larger than cedar supports (" + std::to_string(kMaxDsparkBlockSize) + ")");
    if (c.dspark_noise_token_id < 0 || c.dspark_noise_token_id >= c.vocab_size)
      return invalid_argument("config: dspark_noise_token_id " + std::to_string(c.dspark_noise_token_id) +
                              " is outside the vocabulary");
    CEDAR_RETURN_IF_ERROR(positive(c.dspark_markov_rank, "dspark_markov_rank"));
  }
  return {};
}

Result<ModelConfig> parse_config(const std::string& text) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    return invalid_argument(std::string("config: not valid JSON: ") + e.what());
  }
  if (!root.is_object()) return invalid_argument("config: top level must be a JSON object");
  ModelConfig c;
  std::string model_type;
  const json* text_obj = &root;
  if (root.contains("text_config")) {
    if (!root["text_config"].is_object()) return invalid_argument("config: 'text_config' must be an object");
    text_obj = &root["text_config"];
    c.family = ModelFamily::kV41;
  } else {
    Fields top(root, "config");
    CEDAR_RETURN_IF_ERROR(top.optional("model_type", &model_type));
    c.family = model_type == "deepseek_v4" ? ModelFamily::kV4 : ModelFamily::kV41;
    if (model_type != "deepseek_v4" && model_type != "deepseek_v41" && model_type != "deepseek_v41_text")
      return invalid_argument("config: model_type '" + model_type +
                              "' is not a DeepSeek-V4 / V4.1 model (expected deepseek_v41 or deepseek_v4)");
  }
  if (root.contains("architectures") && root["architectures"].is_array() && !root["architectures"].empty() &&
      root["architectures"][0].is_string())
    c.architecture = root["architectures"][0].get<std::string>();
  Fields top(root, "config");
  CEDAR_RETURN_IF_ERROR(read_text_fields(Fields(*text_obj, c.family == ModelFamily::kV41 && text_obj != &root
                                                              ? "config: text_config" : "config"), c));
  // Special ids may sit at the top level of the nested form.
  CEDAR_RETURN_IF_ERROR(top.optional("bos_token_id", &c.bos_token_id));
  CEDAR_RETURN_IF_ERROR(top.optional("eos_token_id", &c.eos_token_id));
  CEDAR_RETURN_IF_ERROR(top.optional("pad_token_id", &c.pad_token_id));
  CEDAR_RETURN_IF_ERROR(top.optional("image_token_id", &c.image_token_id));
  if (root.contains("quantization_config")) CEDAR_RETURN_IF_ERROR(read_quantization(root["quantization_config"], c));
  if (root.contains("vision_config") && !root["vision_config"].is_null())
    CEDAR_RETURN_IF_ERROR(read_vision(root["vision_config"], c.vision));
  CEDAR_RETURN_IF_ERROR(validate_config(c));
  return c;
}

Result<ModelConfig> load_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("config: cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto r = parse_config(ss.str());
  if (!r.ok()) return Status(r.status().code(), path + ": " + r.status().message());
  return r;
}

std::string config_to_hf_json(const ModelConfig& c) {
  json text = {
      {"model_type", "deepseek_v41_text"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.dim},
      {"moe_intermediate_size", c.moe_inter_dim},
      {"num_hidden_layers", c.n_layers},
      {"num_attention_heads", c.n_heads},
      {"num_key_value_heads", 1},
      {"head_dim", c.head_dim},
      {"qk_rope_head_dim", c.rope_head_dim},
      {"q_lora_rank", c.q_lora_rank},
      {"o_lora_rank", c.o_lora_rank},
      {"o_groups", c.o_groups},
      {"hidden_act", "silu"},
      {"swiglu_limit", c.swiglu_limit},
      {"rms_norm_eps", c.norm_eps},
      {"tie_word_embeddings", false},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rope_theta", c.rope_theta},
      {"rope_scaling",
       {{"rope_type", "yarn"}, {"factor", c.rope_factor}, {"beta_fast", c.beta_fast},
        {"beta_slow", c.beta_slow}, {"original_max_position_embeddings", c.original_seq_len}}},
      {"n_routed_experts", c.n_routed_experts},
      {"n_shared_experts", c.n_shared_experts},
      {"num_experts_per_tok", c.n_activated_experts},
      {"scoring_func", c.score_func},
      {"topk_method", "noaux_tc"},
      {"norm_topk_prob", true},
      {"routed_scaling_factor", c.route_scale},
      {"sliding_window", c.window_size},
      {"compress_ratios", c.compress_ratios},
      {"compress_rope_theta", c.compress_rope_theta},
      {"kv_source_layer_ids", c.kv_source_layers},
      {"index_source_layer_ids", c.index_source_layers},
      {"index_n_heads", c.index_n_heads},
      {"index_head_dim", c.index_head_dim},
      {"index_topk", c.index_topk},
      {"candidate_source_layer_id", c.candidate_source_layer},
      {"candidate_topk_blocks", c.candidate_topk_blocks},
      {"candidate_block_size", c.candidate_block_size},
      {"hc_mult", c.hc_mult},
      {"hc_sinkhorn_iters", c.hc_sinkhorn_iters},
      {"hc_eps", c.hc_eps},
      {"engram_layer_ids", c.engram_layer_ids},
      {"engram_num_embeddings", c.engram_num_embeddings},
      {"engram_max_ngram_size", c.engram_max_ngram_size},
      {"engram_vocab_size", c.engram_vocab_size},
      {"engram_n_heads", c.engram_n_heads},
      {"engram_head_dim", c.engram_head_dim},
      {"engram_pad_token_id", c.engram_pad_id},
      {"engram_compressed_vocab_size", c.engram_compressed_vocab_size},
      {"num_nextn_predict_layers", c.n_mtp_layers},
      {"dspark_block_size", c.dspark_block_size},
      {"dspark_noise_token_id", c.dspark_noise_token_id},
      {"dspark_target_layer_ids", c.dspark_target_layer_ids},
      {"dspark_markov_rank", c.dspark_markov_rank},
      {"dspark_n_routed_experts", c.dspark_n_routed_experts},
      {"dspark_num_experts_per_tok", c.dspark_n_activated_experts},
  };
  json root = {
      {"architectures", {"DeepseekV41ForCausalLM"}},
      {"model_type", "deepseek_v41"},
      {"bos_token_id", c.bos_token_id},
      {"eos_token_id", c.eos_token_id},
      {"pad_token_id", c.pad_token_id},
      {"image_token_id", c.image_token_id},
      {"dtype", "bfloat16"},
      {"quantization_config",
       {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"},
        {"weight_block_size", {c.weight_block_size, c.weight_block_size}}, {"scale_fmt", "ue8m0"},
        {"expert_dtype", c.expert_dtype}}},
      {"text_config", text},
  };
  if (c.vision.present)
    root["vision_config"] = {{"model_type", "deepseek_v41_vision"}, {"num_hidden_layers", c.vision.n_layers},
                             {"hidden_size", c.vision.dim}, {"num_attention_heads", c.vision.n_heads},
                             {"intermediate_size", c.vision.inter_dim}, {"patch_size", c.vision.patch_size},
                             {"rope_theta", c.vision.rope_theta}, {"downsample_ratio", c.vision.downsample},
                             {"max_image_tokens", c.vision.max_n_token}, {"min_pixels", c.vision.min_pixels},
                             {"max_wh_ratio", nullptr}};
  return root.dump(2) + "\n";
}

}  // namespace cedar::model
