// Builds the tensor inventory of spec §3 from a ModelConfig. The shapes follow the reference's
// module constructors (inference/model.py, engram.py, vision.py): Linear stores [out, in], FP8
// weights carry a [ceil(out/b), ceil(in/b)] E8M0 scale, FP4 experts a [out, in/32] E8M0 scale.
#include "spec/weight_inventory.h"

#include <algorithm>

namespace cedar::model {
namespace {

constexpr int kFp4Block = 32;  // one E8M0 scale per 32 FP4 values along K (model.py fp4_block_size)

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

class InventoryBuilder {
 public:
  InventoryBuilder(const ModelConfig& c, std::vector<WeightSpec>& out) : c_(c), out_(out) {}

  WeightGroup group = WeightGroup::kBackbone;

  void add(const std::string& name, Dtype dtype, std::vector<int64_t> shape, WeightKind kind,
           int64_t params_per_elem = 1) {
    WeightSpec s{name, dtype, std::move(shape), kind, group};
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    s.n_bytes = n * static_cast<int64_t>(dtype_size(dtype));
    s.n_params = kind == WeightKind::kScale ? 0 : n * params_per_elem;
    out_.push_back(std::move(s));
  }
  void norm(const std::string& name, int64_t dim) { add(name, Dtype::kBF16, {dim}, WeightKind::kNormWeight); }
  void bf16(const std::string& name, int64_t out, int64_t in) {
    add(name, Dtype::kBF16, {out, in}, WeightKind::kDenseBf16);
  }
  // FP8 E4M3 linear `prefix.weight` [out, in] + `prefix.scale`.
  void fp8(const std::string& prefix, int64_t out, int64_t in) {
    const int64_t b = c_.weight_block_size;
    add(prefix + ".weight", Dtype::kF8E4M3, {out, in}, WeightKind::kFp8Weight);
    add(prefix + ".scale", Dtype::kF8E8M0, {cdiv(out, b), cdiv(in, b)}, WeightKind::kScale);
  }
  // Packed FP4 linear: I8 [out, in/2] (two E2M1 codes per byte) + E8M0 [out, in/32].
  void fp4(const std::string& prefix, int64_t out, int64_t in) {
    add(prefix + ".weight", Dtype::kI8, {out, in / 2}, WeightKind::kFp4Weight, 2);
    add(prefix + ".scale", Dtype::kF8E8M0, {out, in / kFp4Block}, WeightKind::kScale);
  }
  void expert(const std::string& prefix, bool fp4_weights) {
    const int64_t dim = c_.dim, inter = c_.moe_inter_dim;
    if (fp4_weights) {
      fp4(prefix + ".w1", inter, dim);
      fp4(prefix + ".w2", dim, inter);
      fp4(prefix + ".w3", inter, dim);
    } else {
      fp8(prefix + ".w1", inter, dim);
      fp8(prefix + ".w2", dim, inter);
      fp8(prefix + ".w3", inter, dim);
    }
  }

  // One Block: norms, hyper-connection mixers, attention, MoE (and Engram where planned).
  void block(const std::string& p, int layer) {
    const ModelConfig& c = c_;
    const int64_t dim = c.dim, hc = c.hc_mult, mix = (2 + hc) * hc;
    const bool backbone = layer < c.n_layers;
    const int ratio = c.compress_ratios[layer];
    norm(p + ".attn_norm.weight", dim);
    norm(p + ".ffn_norm.weight", dim);
    for (const char* s : {"attn", "ffn"}) {
      add(p + ".hc_" + s + "_fn", Dtype::kF32, {mix, hc * dim}, WeightKind::kDenseF32);
      add(p + ".hc_" + s + "_base", Dtype::kF32, {mix}, WeightKind::kDenseF32);
      add(p + ".hc_" + s + "_scale", Dtype::kF32, {3}, WeightKind::kDenseF32);
    }
    // Attention.
    const std::string a = p + ".attn";
    add(a + ".attn_sink", Dtype::kF32, {c.n_heads}, WeightKind::kDenseF32);
    fp8(a + ".wq_a", c.q_lora_rank, dim);
    norm(a + ".q_norm.weight", c.q_lora_rank);
    fp8(a + ".wq_b", static_cast<int64_t>(c.n_heads) * c.head_dim, c.q_lora_rank);
    fp8(a + ".wkv", c.head_dim, dim);
    norm(a + ".kv_norm.weight", c.head_dim);
    fp8(a + ".wo_a", static_cast<int64_t>(c.o_groups) * c.o_lora_rank,
        static_cast<int64_t>(c.n_heads) * c.head_dim / c.o_groups);
    fp8(a + ".wo_b", dim, static_cast<int64_t>(c.o_groups) * c.o_lora_rank);
    const bool kv_source = backbone && std::count(c.kv_source_layers.begin(), c.kv_source_layers.end(), layer);
    const bool index_source =
        backbone && std::count(c.index_source_layers.begin(), c.index_source_layers.end(), layer);
    if (kv_source) {
      bf16(a + ".compressor.wkv.weight", c.head_dim, dim);
      if (ratio > 1) bf16(a + ".compressor.wgate.weight", c.head_dim, dim);
      norm(a + ".compressor.norm.weight", c.head_dim);
      bf16(a + ".indexer.wk.weight", c.index_head_dim, c.head_dim);
      norm(a + ".indexer.k_norm.weight", c.index_head_dim);
    }
    if (index_source) {
      fp8(a + ".indexer.wq_b", static_cast<int64_t>(c.index_n_heads) * c.index_head_dim, c.q_lora_rank);
      bf16(a + ".indexer.weights_proj.weight", c.index_n_heads, dim);
    }
    // MoE.
    const int64_t n_experts = backbone || c.dspark_n_routed_experts == 0 ? c.n_routed_experts
                                                                          : c.dspark_n_routed_experts;
    const std::string f = p + ".ffn";
    bf16(f + ".gate.weight", n_experts, dim);
    add(f + ".gate.bias", Dtype::kF32, {n_experts}, WeightKind::kDenseF32);
    if (c.vision.present) add(f + ".gate.bias_vl", Dtype::kF32, {n_experts}, WeightKind::kDenseF32);
    for (int64_t e = 0; e < n_experts; ++e) expert(f + ".experts." + std::to_string(e), c.expert_dtype == "fp4");
    expert(f + ".shared_experts", false);
    // Engram runs before this block's attention.
    auto it = std::find(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), layer);
    if (backbone && it != c.engram_layer_ids.end()) {
      const int64_t rows = c.engram_num_embeddings[it - c.engram_layer_ids.begin()];
      const int64_t n_cols = static_cast<int64_t>(c.engram_max_ngram_size - 1) * c.engram_n_heads;
      const std::string e = p + ".engram";
      WeightGroup saved = group;
      group = WeightGroup::kEngram;
      add(e + ".embed.weight", Dtype::kF8E4M3, {rows, c.engram_head_dim}, WeightKind::kEngramTable);
      add(e + ".embed.scale", Dtype::kF8E8M0, {rows, c.engram_head_dim / 32}, WeightKind::kScale);
      group = saved;
      fp8(e + ".wkv", dim * (hc + 1), n_cols * c.engram_head_dim);
      add(e + ".q_weight", Dtype::kBF16, {hc, dim}, WeightKind::kNormWeight);
      add(e + ".k_weight", Dtype::kBF16, {hc, dim}, WeightKind::kNormWeight);
    }
  }

  void vision() {
    const VisionConfig& v = c_.vision;
    const int64_t vd = v.dim, r = v.downsample;
    group = WeightGroup::kVision;
    bf16("vision.patch_embed.proj.weight", vd, 3LL * v.patch_size * v.patch_size);
    add("vision.patch_embed.proj.bias", Dtype::kBF16, {vd}, WeightKind::kDenseBf16);
    for (int b = 0; b < v.n_layers; ++b) {
      const std::string p = "vision.blocks." + std::to_string(b);
      norm(p + ".norm1.weight", vd);
      bf16(p + ".attn.wqkv.weight", 3 * vd, vd);
      add(p + ".attn.wqkv.bias", Dtype::kBF16, {3 * vd}, WeightKind::kDenseBf16);
      bf16(p + ".attn.wo.weight", vd, vd);
      add(p + ".attn.wo.bias", Dtype::kBF16, {vd}, WeightKind::kDenseBf16);
      norm(p + ".norm2.weight", vd);
      bf16(p + ".mlp.w1.weight", 2LL * v.inter_dim, vd);
      bf16(p + ".mlp.w2.weight", vd, v.inter_dim);
    }
    norm("vision.norm.weight", vd);
    bf16("aligner.w1.weight", c_.dim, vd * r * r);
    add("aligner.w1.bias", Dtype::kBF16, {c_.dim}, WeightKind::kDenseBf16);
    bf16("aligner.w2.weight", c_.dim, c_.dim);
    add("aligner.w2.bias", Dtype::kBF16, {c_.dim}, WeightKind::kDenseBf16);
    for (const char* s : {"image_start", "image_end", "image_newline"})
      add(s, Dtype::kBF16, {c_.dim}, WeightKind::kDenseBf16);
  }

 private:
  const ModelConfig& c_;
  std::vector<WeightSpec>& out_;
};

}  // namespace

const char* weight_group_name(WeightGroup g) {
  switch (g) {
    case WeightGroup::kBackbone: return "backbone";
    case WeightGroup::kEngram: return "engram";
    case WeightGroup::kDspark: return "dspark";
    case WeightGroup::kVision: return "vision";
  }
  return "?";
}

std::vector<WeightSpec> weight_inventory(const ModelConfig& c) {
  std::vector<WeightSpec> out;
  InventoryBuilder b(c, out);
  b.bf16("embed.weight", c.vocab_size, c.dim);
  b.bf16("head.weight", c.vocab_size, c.dim);
  b.norm("norm.weight", c.dim);
  for (int l = 0; l < c.n_layers; ++l) b.block("layers." + std::to_string(l), l);
  // DSpark stages (V4.1) live under mtp.S; they reuse embed and head.
  b.group = WeightGroup::kDspark;
  for (int s = 0; s < c.n_mtp_layers; ++s) {
    const std::string p = "mtp." + std::to_string(s);
    b.block(p, c.n_layers + s);
    if (c.family != ModelFamily::kV41) continue;
    if (s == 0) {
      b.fp8(p + ".main_proj", c.dim, static_cast<int64_t>(c.dim) * c.dspark_target_layer_ids.size());
      b.norm(p + ".main_norm.weight", c.dim);
    }
    if (s == c.n_mtp_layers - 1) {
      b.norm(p + ".norm.weight", c.dim);
      b.bf16(p + ".markov_head.embed.weight", c.vocab_size, c.dspark_markov_rank);
      b.bf16(p + ".markov_head.head.weight", c.vocab_size, c.dspark_markov_rank);
      b.bf16(p + ".confidence_head.proj.weight", 1, c.dim + c.dspark_markov_rank);
    }
  }
  if (c.vision.present) b.vision();
  return out;
}

ParamCounts count_params(const std::vector<WeightSpec>& inv) {
  ParamCounts pc;
  for (const auto& w : inv) {
    ++pc.n_tensors;
    int64_t* params = nullptr;
    int64_t* bytes = nullptr;
    switch (w.group) {
      case WeightGroup::kBackbone: params = &pc.backbone; bytes = &pc.backbone_bytes; break;
      case WeightGroup::kEngram: params = &pc.engram; bytes = &pc.engram_bytes; break;
      case WeightGroup::kDspark: params = &pc.dspark; bytes = &pc.dspark_bytes; break;
      case WeightGroup::kVision: params = &pc.vision; bytes = &pc.vision_bytes; break;
    }
    *params += w.n_params;
    *bytes += w.n_bytes;
    if (w.group == WeightGroup::kBackbone && w.name.find(".ffn.experts.") != std::string::npos) {
      pc.routed_expert_params += w.n_params;
      pc.routed_expert_bytes += w.n_bytes;
    }
  }
  return pc;
}

}  // namespace cedar::model
