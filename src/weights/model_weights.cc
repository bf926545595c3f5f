#include "weights/model_weights.h"

#include <cstring>

namespace cedar::model {
namespace {

class Binder {
 public:
  Binder(const WeightMap& map, ModelWeights& mw) : map_(map), mw_(mw) {}

  const io::TensorView& t(const std::string& name) { return map_.at(name); }

  ops::Fp8Weight fp8(const std::string& prefix) {
    const io::TensorView& w = t(prefix + ".weight");
    const io::TensorView& s = t(prefix + ".scale");
    return {w.data, s.data, static_cast<size_t>(w.shape[0]), static_cast<size_t>(w.shape[1])};
  }
  ops::Fp4Weight fp4(const std::string& prefix) {
    const io::TensorView& w = t(prefix + ".weight");
    const io::TensorView& s = t(prefix + ".scale");
    return {w.data, s.data, static_cast<size_t>(w.shape[0]), static_cast<size_t>(w.shape[1]) * 2};
  }
  // A typed pointer into the mapping, or into an owned copy when the mapped bytes are misaligned for T
  // (cedar-written shards pack tensors back to back).
  template <typename T>
  const T* typed_ptr(const std::string& name, std::vector<std::unique_ptr<std::vector<T>>>& owned) {
    const io::TensorView& v = t(name);
    if (reinterpret_cast<uintptr_t>(v.data) % alignof(T) == 0) return reinterpret_cast<const T*>(v.data);
    auto copy = std::make_unique<std::vector<T>>(v.nbytes / sizeof(T));
    std::memcpy(copy->data(), v.data, v.nbytes);
    owned.push_back(std::move(copy));
    return owned.back()->data();
  }
  const uint16_t* bf16_ptr(const std::string& name) { return typed_ptr(name, mw_.owned_bf16); }
  const float* f32_ptr(const std::string& name) { return typed_ptr(name, mw_.owned_f32); }
  ops::Bf16Weight bf16(const std::string& name) {
    const io::TensorView& v = t(name);
    return {bf16_ptr(name), static_cast<size_t>(v.shape[0]), static_cast<size_t>(v.shape[1])};
  }
 private:
  const WeightMap& map_;
  ModelWeights& mw_;
};

}  // namespace

namespace {

// One Block's weights under prefix `p` (layers.L or mtp.S).
void bind_block(Binder& b, const WeightMap& map, const std::string& p, const LayerPlanEntry& e, BlockWeights& bw) {
  {
    bw.attn_norm = b.bf16_ptr(p + ".attn_norm.weight");
    bw.ffn_norm = b.bf16_ptr(p + ".ffn_norm.weight");
    bw.hc_attn_fn = b.f32_ptr(p + ".hc_attn_fn");
    bw.hc_attn_base = b.f32_ptr(p + ".hc_attn_base");
    bw.hc_attn_scale = b.f32_ptr(p + ".hc_attn_scale");
    bw.hc_ffn_fn = b.f32_ptr(p + ".hc_ffn_fn");
    bw.hc_ffn_base = b.f32_ptr(p + ".hc_ffn_base");
    bw.hc_ffn_scale = b.f32_ptr(p + ".hc_ffn_scale");
    AttentionWeights& a = bw.attn;
    const std::string ap = p + ".attn";
    a.attn_sink = b.f32_ptr(ap + ".attn_sink");
    a.wq_a = b.fp8(ap + ".wq_a");
    a.q_norm = b.bf16_ptr(ap + ".q_norm.weight");
    a.wq_b = b.fp8(ap + ".wq_b");
    a.wkv = b.fp8(ap + ".wkv");
    a.kv_norm = b.bf16_ptr(ap + ".kv_norm.weight");
    a.wo_a = b.fp8(ap + ".wo_a");
    a.wo_b = b.fp8(ap + ".wo_b");
    if (e.mode == AttnMode::kFull) {
      a.comp_wkv = b.bf16(ap + ".compressor.wkv.weight");
      if (e.compress_ratio > 1) a.comp_wgate = b.bf16(ap + ".compressor.wgate.weight");
      a.comp_norm = b.bf16_ptr(ap + ".compressor.norm.weight");
      a.idx_wk = b.bf16(ap + ".indexer.wk.weight");
      a.idx_k_norm = b.bf16_ptr(ap + ".indexer.k_norm.weight");
    }
    if (e.mode == AttnMode::kFull || e.mode == AttnMode::kReindex) {
      a.idx_wq_b = b.fp8(ap + ".indexer.wq_b");
      a.idx_weights_proj = b.bf16(ap + ".indexer.weights_proj.weight");
    }
    const std::string fp = p + ".ffn";
    bw.gate = b.bf16(fp + ".gate.weight");
    bw.gate_bias = b.f32_ptr(fp + ".gate.bias");
    if (map.find(fp + ".gate.bias_vl")) bw.gate_bias_vl = b.f32_ptr(fp + ".gate.bias_vl");
    bw.experts.resize(e.n_routed_experts);
    for (int x = 0; x < e.n_routed_experts; ++x) {
      const std::string xp = fp + ".experts." + std::to_string(x);
      bw.experts[x] = {b.fp4(xp + ".w1"), b.fp4(xp + ".w2"), b.fp4(xp + ".w3")};
    }
    bw.shared = {b.fp8(fp + ".shared_experts.w1"), b.fp8(fp + ".shared_experts.w2"),
                 b.fp8(fp + ".shared_experts.w3")};
    if (e.engram) {
      bw.has_engram = true;
      const std::string ep = p + ".engram";
      const io::TensorView& table = b.t(ep + ".embed.weight");
      bw.engram.table = table.data;
      bw.engram.table_scale = b.t(ep + ".embed.scale").data;
      bw.engram.rows = table.shape[0];
      bw.engram.wkv = b.fp8(ep + ".wkv");
      bw.engram.q_weight = b.bf16_ptr(ep + ".q_weight");
      bw.engram.k_weight = b.bf16_ptr(ep + ".k_weight");
    }
  }
}

}  // namespace

Result<std::unique_ptr<ModelWeights>> bind_model_weights(const ModelConfig& c, const LayerPlan& plan,
                                                         const WeightMap& map, bool with_dspark) {
  auto mw = std::make_unique<ModelWeights>();
  Binder b(map, *mw);
  mw->embed = b.bf16("embed.weight");
  mw->head = b.bf16("head.weight");
  mw->norm = b.bf16_ptr("norm.weight");
  mw->blocks.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) bind_block(b, map, "layers." + std::to_string(l), plan.layers[l], mw->blocks[l]);
  if (!with_dspark || c.n_mtp_layers == 0) return mw;
  // DSpark stages (docs/DSPARK.md): window-only blocks, plus stage 0's main_proj / main_norm and the
  // last stage's norm and heads.
  auto d = std::make_unique<DsparkWeights>();
  d->stages.resize(c.n_mtp_layers);
  for (int s = 0; s < c.n_mtp_layers; ++s)
    bind_block(b, map, "mtp." + std::to_string(s), plan.layers[c.n_layers + s], d->stages[s]);
  const std::string first = "mtp.0", last = "mtp." + std::to_string(c.n_mtp_layers - 1);
  d->main_proj = b.fp8(first + ".main_proj");
  d->main_norm = b.bf16_ptr(first + ".main_norm.weight");
  d->norm = b.bf16_ptr(last + ".norm.weight");
  d->markov_embed = b.bf16(last + ".markov_head.embed.weight");
  d->markov_head = b.bf16(last + ".markov_head.head.weight");
  d->confidence = b.bf16(last + ".confidence_head.proj.weight");
  mw->dspark = std::move(d);
  return mw;
}

}  // namespace cedar::model
