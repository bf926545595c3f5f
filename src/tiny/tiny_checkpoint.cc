// Tiny / small checkpoint writer. Values are drawn per tensor from WeightRng seeded by
// (seed, tensor name), so a tensor's contents do not depend on the order or sharding of writes.
#include "tiny/tiny_checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <map>

#include "core/file.h"
#include "io/safetensors_writer.h"
#include "spec/engram_layout.h"
#include "spec/weight_inventory.h"
#include "ops/formats/formats.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer/marker_tokens.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"

namespace cedar::model {
namespace fs = std::filesystem;

uint64_t WeightRng::next_u64() {  // SplitMix64
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float WeightRng::uniform_pm1() {
  return static_cast<float>(static_cast<int32_t>(next_u64() >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

float WeightRng::normalish() {
  // Sum of 4 U(-1,1) has variance 4/3; scale to unit variance.
  float s = uniform_pm1() + uniform_pm1() + uniform_pm1() + uniform_pm1();
  return s * 0.8660254f;
}

ModelConfig tiny_config(TinyPreset preset) {
  ModelConfig c;
  c.family = ModelFamily::kV41;
  c.architecture = "DeepseekV41ForCausalLM";
  c.vocab_size = 129280;
  c.n_layers = 40;
  c.n_mtp_layers = 3;
  c.score_func = "sqrtsoftplus";
  c.route_scale = 1.5;
  c.swiglu_limit = 10.0;
  c.norm_eps = 1e-20;
  c.max_position_embeddings = 1048576;
  c.rope_theta = 10000;
  c.compress_rope_theta = 160000;
  c.rope_factor = 16;
  c.beta_fast = 32;
  c.beta_slow = 1;
  c.original_seq_len = 65536;
  c.compress_ratios.assign(2, 0);
  c.compress_ratios.insert(c.compress_ratios.end(), 18, 2);
  c.compress_ratios.insert(c.compress_ratios.end(), 20, 1);
  c.compress_ratios.insert(c.compress_ratios.end(), 3, 0);
  c.kv_source_layers = {2, 8, 14, 20};
  c.index_source_layers = {2, 8, 14, 20, 24, 28, 32, 36};
  c.candidate_source_layer = 20;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.engram_layer_ids = {1, 14};
  c.engram_max_ngram_size = 4;
  c.engram_pad_id = 2;
  c.dspark_noise_token_id = 128799;
  c.dspark_target_layer_ids = {37, 38, 39};
  c.dspark_block_size = 5;
  c.n_shared_experts = 1;
  c.weight_block_size = 32;
  c.expert_dtype = "fp4";
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.pad_token_id = 2;
  c.image_token_id = 129264;
  if (preset == TinyPreset::kTiny) {
    // Small enough that a few hundred tokens cross the window (16), the index top-k (16), the
    // candidate pool (8 blocks x 4 entries) and many ratio-2 group boundaries.
    c.dim = 64;
    c.moe_inter_dim = 32;
    c.n_heads = 4;
    c.head_dim = 64;
    c.rope_head_dim = 16;
    c.q_lora_rank = 32;
    c.o_groups = 2;
    c.o_lora_rank = 32;
    c.n_routed_experts = 16;
    c.n_activated_experts = 6;
    c.window_size = 16;
    c.index_n_heads = 4;
    c.index_head_dim = 32;
    c.index_topk = 16;
    c.candidate_topk_blocks = 8;
    c.candidate_block_size = 4;
    c.engram_n_heads = 2;
    c.engram_head_dim = 32;
    c.engram_vocab_size = 1000;
    c.dspark_markov_rank = 16;
    c.dspark_n_routed_experts = 8;
    c.dspark_n_activated_experts = 3;
  } else if (preset == TinyPreset::kSmall) {
    // About 1.6 GB: real head geometry (rope 64, window 128), smaller width and expert count.
    c.dim = 1024;
    c.moe_inter_dim = 512;
    c.n_heads = 16;
    c.head_dim = 128;
    c.rope_head_dim = 64;
    c.q_lora_rank = 256;
    c.o_groups = 4;
    c.o_lora_rank = 256;
    c.n_routed_experts = 32;
    c.n_activated_experts = 6;
    c.window_size = 128;
    c.index_n_heads = 8;
    c.index_head_dim = 128;
    c.index_topk = 128;
    c.candidate_topk_blocks = 64;
    c.candidate_block_size = 8;
    c.engram_n_heads = 4;
    c.engram_head_dim = 64;
    c.engram_vocab_size = 20000;
    c.dspark_markov_rank = 64;
    c.dspark_n_routed_experts = 16;
    c.dspark_n_activated_experts = 3;
  } else if (preset == TinyPreset::kAttention) {
    // Long-context test bed: the released attention, compressor, indexer, candidate pool and layer plan
    // (compress_ratios, KV / index / candidate sources as above), so what depth adds per token is
    // measured on the released shapes. What does not grow with depth shrinks: the projections' input
    // and output width (dim: no attention shape depends on it, and the 129,280-row embedding and head
    // are 2 x vocab x dim bf16) and the query / output LoRA ranks (wq_b and wo_a are 64 x 512 x rank:
    // 42 + 34 MB per layer at the released 1280 / 1024); experts, Engram and DSpark stay small.
    c.dim = 256;
    c.moe_inter_dim = 128;
    c.n_heads = 64;
    c.head_dim = 512;
    c.rope_head_dim = 64;
    c.q_lora_rank = 64;
    c.o_groups = 8;
    c.o_lora_rank = 64;
    c.n_routed_experts = 16;
    c.n_activated_experts = 6;
    c.window_size = 128;
    c.index_n_heads = 32;
    c.index_head_dim = 128;
    c.index_topk = 512;
    c.candidate_topk_blocks = 2048;
    c.candidate_block_size = 8;
    c.engram_n_heads = 4;
    c.engram_head_dim = 64;
    c.engram_vocab_size = 5000;
    c.dspark_markov_rank = 16;
    c.dspark_n_routed_experts = 8;
    c.dspark_n_activated_experts = 3;
  } else {
    // Streaming test bed: released expert shapes, few layers, many experts, big Engram tables; the
    // attention is as small as the layer plan allows (dim stays 5120 because the experts need it).
    c.n_layers = 6;
    c.compress_ratios = {0, 2, 2, 1, 1, 1, 0, 0, 0};  // + 3 DSpark stages (window-only)
    c.kv_source_layers = {1, 3};
    c.index_source_layers = {1, 3, 5};
    c.candidate_source_layer = 3;
    c.engram_layer_ids = {1, 2};
    c.dspark_target_layer_ids = {3, 4, 5};
    c.dim = 5120;
    c.moe_inter_dim = 2304;
    c.n_heads = 8;
    c.head_dim = 128;
    c.rope_head_dim = 64;
    c.q_lora_rank = 256;
    c.o_groups = 4;
    c.o_lora_rank = 128;
    c.n_routed_experts = 96;
    c.n_activated_experts = 6;
    c.window_size = 128;
    c.index_n_heads = 8;
    c.index_head_dim = 128;
    c.index_topk = 128;
    c.candidate_topk_blocks = 16;
    c.candidate_block_size = 8;
    c.engram_n_heads = 4;
    c.engram_head_dim = 256;
    c.engram_vocab_size = 790000;  // 12 hash tables of ~790k rows per layer: 2.5 GB of 264-byte rows
    c.dspark_markov_rank = 16;
    c.dspark_n_routed_experts = 8;
    c.dspark_n_activated_experts = 3;
  }
  EngramLayout layout = make_engram_layout(c);
  c.engram_num_embeddings = layout.rows;
  return c;
}

void remove_dspark(ModelConfig& c) {
  c.compress_ratios.resize(static_cast<size_t>(c.n_layers));
  c.n_mtp_layers = 0;
  c.dspark_block_size = 0;
  c.dspark_target_layer_ids.clear();
  c.dspark_n_routed_experts = c.dspark_n_activated_experts = 0;
}

VisionConfig tiny_vision_config() {
  VisionConfig v;
  v.present = true;
  v.n_layers = 2;
  v.dim = 64;
  v.n_heads = 4;
  v.inter_dim = 48;
  v.patch_size = 14;
  v.downsample = 3;
  v.max_n_token = 1024;
  v.min_pixels = 295936;
  v.rope_theta = 10000;
  return v;
}

namespace {

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a over the name, mixed with the seed
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// Power-of-two scale s = 2^e, the smallest with amax / s <= qmax (exact via frexp).
int pow2_exponent_for(float amax, float qmax) {
  if (!(amax > 0)) return -20;
  int e;
  std::frexp(amax / qmax, &e);  // amax/qmax = m * 2^e, m in [0.5, 1)
  float lower = std::ldexp(1.0f, e - 1);
  return (amax / qmax <= lower) ? e - 1 : e;
}

// Target standard deviation of a tensor's logical values, chosen so activations stay O(1).
float weight_std(const WeightSpec& w, int64_t fan_in) {
  const std::string& n = w.name;
  if (n == "embed.weight") return 1.0f;
  if (n.ends_with("_fn")) return 0.5f / std::sqrt(static_cast<float>(fan_in));
  if (n.ends_with("_base")) return 0.3f;
  if (n.ends_with("_scale")) return 0.5f;
  if (n.ends_with("attn_sink")) return 1.0f;
  if (n.ends_with("gate.bias") || n.ends_with("gate.bias_vl")) return 0.05f;
  if (n.find("engram.embed") != std::string::npos) return 1.0f;
  if (n.ends_with("q_weight") || n.ends_with("k_weight")) return 0.3f;
  return 1.0f / std::sqrt(static_cast<float>(fan_in));
}

// Produces the stored bytes of one tensor (and of its `.scale` companion where quantised).
struct TensorBytes {
  std::vector<uint8_t> data, scale;
};

// The power-of-two exponent e with 2^e <= x < 2^(e+1), by integer steps (no libm: portable bits).
int floor_log2(double x) {
  int e = 0;
  while (x >= 2) x /= 2, ++e;
  while (x < 1) x *= 2, --e;
  return e;
}

// kStream's experts and Engram tables, drawn as bytes. FP4: uniform random E2M1 nibbles (RMS 2.93)
// with one scale per row giving logical values of standard deviation ~1/sqrt(k). Engram: E4M3 codes
// with exponent field 5..8 (magnitudes 0.25..3.75, never NaN) and unit scales.
bool fast_tensor(const WeightSpec& w, uint64_t seed, TensorBytes* out) {
  if (w.kind != WeightKind::kFp4Weight && w.kind != WeightKind::kEngramTable) return false;
  WeightRng rng(name_seed(seed, w.name));
  const int64_t rows = w.shape[0], cols = w.shape.back();
  out->data.resize(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < out->data.size(); i += 8) {
    const uint64_t r = rng.next_u64();
    const size_t n = std::min<size_t>(8, out->data.size() - i);
    std::memcpy(&out->data[i], &r, n);
  }
  if (w.kind == WeightKind::kFp4Weight) {
    const int64_t k = 2 * cols;
    const int e = floor_log2(1.0 / (2.93 * std::sqrt(static_cast<double>(k))));
    out->scale.assign(static_cast<size_t>(rows * (k / 32)), static_cast<uint8_t>(127 + e));
  } else {
    for (uint8_t& b : out->data) b = static_cast<uint8_t>((b & 0x87) | ((5 + ((b >> 3) & 3)) << 3));
    out->scale.assign(static_cast<size_t>(rows * (cols / 32)), 127);
  }
  return true;
}

TensorBytes make_tensor(const WeightSpec& w, uint64_t seed, int block, bool fast) {
  TensorBytes out;
  if (fast && fast_tensor(w, seed, &out)) return out;
  WeightRng rng(name_seed(seed, w.name));
  const int64_t rows = w.shape.size() >= 2 ? w.shape[0] : 1;
  const int64_t cols_stored = w.shape.empty() ? 1 : w.shape.back();
  const int64_t numel = rows * cols_stored;
  switch (w.kind) {
    case WeightKind::kNormWeight: {
      out.data.resize(numel * 2);
      for (int64_t i = 0; i < numel; ++i) {
        uint16_t b = ops::f32_to_bf16_bits(1.0f + 0.1f * rng.uniform_pm1());
        std::memcpy(&out.data[2 * i], &b, 2);
      }
      break;
    }
    case WeightKind::kDenseBf16: {
      const float std_ = weight_std(w, cols_stored);
      out.data.resize(numel * 2);
      for (int64_t i = 0; i < numel; ++i) {
        uint16_t b = ops::f32_to_bf16_bits(std_ * rng.normalish());
        std::memcpy(&out.data[2 * i], &b, 2);
      }
      break;
    }
    case WeightKind::kDenseF32: {
      const float std_ = weight_std(w, cols_stored);
      out.data.resize(numel * 4);
      for (int64_t i = 0; i < numel; ++i) {
        float v = std_ * rng.normalish();
        if (w.name.ends_with("_scale")) v = 0.5f + std::fabs(v);  // positive mixing temperatures
        std::memcpy(&out.data[4 * i], &v, 4);
      }
      break;
    }
    case WeightKind::kFp8Weight:
    case WeightKind::kEngramTable: {
      // E4M3 codes with one E8M0 scale per (block x block) tile, or per 32 columns of a row for
      // Engram tables; the scale is the power of two that maps the tile's amax into E4M3 range.
      const bool per_row = w.kind == WeightKind::kEngramTable;
      const int64_t cols = cols_stored;
      const int64_t br = per_row ? 1 : block, bc = per_row ? 32 : block;
      const float std_ = weight_std(w, cols);
      std::vector<float> v(numel);
      for (auto& x : v) x = std_ * rng.normalish();
      const int64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
      out.data.resize(numel);
      out.scale.resize(nbr * nbc);
      for (int64_t bi = 0; bi < nbr; ++bi)
        for (int64_t bj = 0; bj < nbc; ++bj) {
          float amax = 0;
          for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r)
            for (int64_t k = bj * bc; k < std::min(cols, (bj + 1) * bc); ++k) amax = std::max(amax, std::fabs(v[r * cols + k]));
          const int e = pow2_exponent_for(amax, ops::kE4M3Max);
          out.scale[bi * nbc + bj] = static_cast<uint8_t>(e + 127);
          for (int64_t r = bi * br; r < std::min(rows, (bi + 1) * br); ++r)
            for (int64_t k = bj * bc; k < std::min(cols, (bj + 1) * bc); ++k)
              out.data[r * cols + k] = ops::f32_to_e4m3(std::ldexp(v[r * cols + k], -e));
        }
      break;
    }
    case WeightKind::kFp4Weight: {
      // Logical [rows, 2*cols_stored]; per row, one E8M0 scale per 32 values.
      const int64_t k = 2 * cols_stored;
      const float std_ = weight_std(w, k);
      out.data.resize(numel);
      out.scale.resize(rows * (k / 32));
      std::vector<float> row(k);
      for (int64_t r = 0; r < rows; ++r) {
        for (auto& x : row) x = std_ * rng.normalish();
        for (int64_t b = 0; b < k / 32; ++b) {
          float amax = 0;
          for (int64_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(row[b * 32 + j]));
          const int e = pow2_exponent_for(amax, ops::kE2M1Max);
          out.scale[r * (k / 32) + b] = static_cast<uint8_t>(e + 127);
          for (int64_t j = 0; j < 32; j += 2) {
            uint8_t lo = ops::f32_to_e2m1(std::ldexp(row[b * 32 + j], -e));
            uint8_t hi = ops::f32_to_e2m1(std::ldexp(row[b * 32 + j + 1], -e));
            out.data[r * cols_stored + (b * 32 + j) / 2] = ops::pack_fp4_pair(lo, hi);
          }
        }
      }
      break;
    }
    case WeightKind::kScale:
      break;  // produced together with its weight
  }
  return out;
}

// Which shard a tensor goes to: top-level tensors and layers spread over n-1 shards by layer,
// DSpark and vision in the last shard.
int shard_of(const std::string& name, int n_layers, int n_shards) {
  if (name.rfind("layers.", 0) == 0) {
    int layer = std::atoi(name.c_str() + 7);
    return std::min(n_shards - 2, layer * (n_shards - 1) / n_layers);
  }
  if (name.rfind("mtp.", 0) == 0 || name.rfind("vision.", 0) == 0 || name.rfind("aligner.", 0) == 0 ||
      name.rfind("image_", 0) == 0)
    return n_shards - 1;
  return 0;
}

Status write_text_file(const fs::path& path, const std::string& text) {
  std::span<const uint8_t> chunk(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  return io::detail::write_file_atomically(path.string(), std::span<const std::span<const uint8_t>>(&chunk, 1));
}

}  // namespace

Result<TinyTokenizer> prepare_tiny_tokenizer(const std::string& dir) {
  TinyTokenizer t;
  CEDAR_ASSIGN_OR_RETURN(tokenizer::TokenizerFiles files, tokenizer::read_tokenizer_files(dir));
  CEDAR_ASSIGN_OR_RETURN(t.tokenizer_json, tokenizer::add_v41_markers(files.tokenizer_json, &t.added_markers));
  t.config_json = std::move(files.config_json);
  CEDAR_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::from_json(t.tokenizer_json, t.config_json, files.source));
  t.vocab_size = tok->vocab_size();
  (void)tokenizer::build_engram_token_map(*tok, &t.engram_classes);
  return t;
}

Status write_tiny_checkpoint(const ModelConfig& c, const TinyOptions& opt) {
  CEDAR_RETURN_IF_ERROR(validate_config(c));
  std::error_code ec;
  fs::create_directories(opt.out_dir, ec);
  if (ec) return io_error("make-tiny: cannot create " + opt.out_dir, ec.value());

  const std::vector<WeightSpec> inventory = weight_inventory(c);
  const int n_shards = opt.n_shards > 1                       ? opt.n_shards
                       : opt.preset == TinyPreset::kTiny      ? 4
                       : opt.preset == TinyPreset::kSmall     ? 8
                       : opt.preset == TinyPreset::kAttention ? 6
                                                              : 13;  // kStream: about one layer per two shards
  std::map<std::string, std::string> weight_map;
  uint64_t total = 0;
  for (int s = 0; s < n_shards; ++s) {
    if (opt.progress) opt.progress(s, n_shards);
    char fname[64];
    std::snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
    io::SafetensorsWriter writer;
    writer.set_metadata("format", "pt");
    for (size_t i = 0; i < inventory.size(); ++i) {
      const WeightSpec& w = inventory[i];
      if (w.kind == WeightKind::kScale || shard_of(w.name, c.n_layers, n_shards) != s) continue;
      TensorBytes tb = make_tensor(w, opt.seed, c.weight_block_size, opt.preset == TinyPreset::kStream);
      CEDAR_RETURN_IF_ERROR(writer.add(w.name, w.dtype, w.shape, std::move(tb.data)));
      weight_map[w.name] = fname;
      if (i + 1 < inventory.size() && inventory[i + 1].kind == WeightKind::kScale) {
        const WeightSpec& sc = inventory[i + 1];
        if (static_cast<int64_t>(tb.scale.size()) != sc.n_bytes)
          return internal_error("make-tiny: scale size mismatch for " + sc.name);
        CEDAR_RETURN_IF_ERROR(writer.add(sc.name, sc.dtype, sc.shape, std::move(tb.scale)));
        weight_map[sc.name] = fname;
      }
    }
    total += writer.data_bytes();
    CEDAR_RETURN_IF_ERROR(writer.write((fs::path(opt.out_dir) / fname).string()));
  }
  CEDAR_RETURN_IF_ERROR(io::write_index_json(opt.out_dir, total, weight_map));

  // config.json and the tokenizer files.
  CEDAR_RETURN_IF_ERROR(write_text_file(fs::path(opt.out_dir) / "config.json", config_to_hf_json(c)));
  if (opt.tokenizer) {
    CEDAR_RETURN_IF_ERROR(write_text_file(fs::path(opt.out_dir) / "tokenizer.json", opt.tokenizer->tokenizer_json));
    if (!opt.tokenizer->config_json.empty())
      CEDAR_RETURN_IF_ERROR(
          write_text_file(fs::path(opt.out_dir) / "tokenizer_config.json", opt.tokenizer->config_json));
  }
  return {};
}

}  // namespace cedar::model
