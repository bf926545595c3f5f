// The vision tower of inference/vision.py, one type per reference class: VisionAttention
// (Attention), VisionMlp (MLP), VisionBlock (Block) and VisionTower (ViT: PatchEmbed, the blocks, the
// final RMSNorm); the Aligner is vision_aligner.h. The weights are the released tensors (vision.*),
// read from the checkpoint mapping, never copied unless misaligned.
//
// Every linear runs over all patches at once through the kernel set (ops::KernelSet::linear_bf16),
// threads over output rows; attention threads over heads. In exact numerics the tower is bit-identical
// to tools/golden/vision_reference.py (docs/GOLDEN.md, "Vision"): a bf16 linear with bias is the exact
// dot rounded to f32, plus the bias in f32, rounded to bf16; RMSNorm eps 1e-6; the 2D RoPE rotates the
// two halves of each head (rotate-half) by row angles then column angles; attention is a softmax over
// every patch with fp32 logits, correctly rounded exp, float64 sums and bf16 probabilities in the PV
// product. In fast numerics the linears are the kernel set's fast ones and attention is two GEMMs
// per block of queries (S = Q K^T, O = P V) with an fp32 softmax: same semantics, fp32 rounding; no
// bound is derived for it yet.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "spec/config.h"
#include "weights/weight_map.h"
#include "ops/kernel_set.h"

namespace cedar::model {

// Owns aligned copies of tensors the mapping holds misaligned (cedar-written shards pack tensors
// back to back); aligned ones are used in place.
struct VisionTensorStore {
  std::vector<std::unique_ptr<std::vector<uint16_t>>> copies;
  const uint16_t* bf16(const WeightMap& map, std::string_view name);
  ops::Bf16Weight linear(const WeightMap& map, const std::string& name);
};

// A bf16 nn.Linear with bias over m rows: y = bf16(f32(x . W^T) + bias).
void vision_linear_bias(const ops::KernelSet& ks, const float* x, size_t m, const ops::Bf16Weight& w,
                        const uint16_t* bias, float* y, ThreadPool* pool);

// get_vision_cos_sin: per patch (reading order), rope_dim angles = row * inv_freq then column * inv_freq.
struct VisionRope {
  int rope_dim = 0;             // half a head
  std::vector<float> cos, sin;  // [n_h * n_w, rope_dim]
  static VisionRope make(int n_h, int n_w, int rope_dim, double theta);
};

class VisionAttention {
 public:
  VisionAttention(const VisionConfig& config, const WeightMap& map, const std::string& prefix,
                  VisionTensorStore* store);
  // x: [n, dim] normalised input; out: [n, dim].
  void forward(const float* x, size_t n, const VisionRope& rope, float* out, const ops::KernelSet& ks,
               ThreadPool* pool) const;

 private:
  // qkv: [n, 3 * dim] after the RoPE; attended: [n, dim].
  void attend_exact(const float* qkv, size_t n, float* attended, ThreadPool* pool) const;
  void attend_fast(const float* qkv, size_t n, float* attended, const ops::KernelSet& ks, ThreadPool* pool) const;

  int dim_, n_heads_, head_dim_;
  ops::Bf16Weight wqkv_, wo_;
  const uint16_t* wqkv_bias_;
  const uint16_t* wo_bias_;
};

class VisionMlp {
 public:
  VisionMlp(const VisionConfig& config, const WeightMap& map, const std::string& prefix, VisionTensorStore* store);
  void forward(const float* x, size_t n, float* out, const ops::KernelSet& ks, ThreadPool* pool) const;

 private:
  int inter_dim_;
  ops::Bf16Weight w1_, w2_;  // w1 = [gate | up]
};

class VisionBlock {
 public:
  VisionBlock(const VisionConfig& config, const WeightMap& map, const std::string& prefix, VisionTensorStore* store);
  // x [n, dim] in place: x += attn(norm1(x)); x += mlp(norm2(x)).
  void forward(float* x, size_t n, const VisionRope& rope, const ops::KernelSet& ks, ThreadPool* pool) const;

 private:
  int dim_;
  const uint16_t* norm1_;
  const uint16_t* norm2_;
  VisionAttention attn_;
  VisionMlp mlp_;
};

class VisionTower {
 public:
  // Fails when the config has no vision tower.
  static Result<std::unique_ptr<VisionTower>> bind(const ModelConfig& config, const WeightMap& map);

  // What forward() shows a caller after each stage: "patch_embed", "block0".., "norm" with [n, dim].
  using Observer = std::function<void(std::string_view stage, std::span<const float> values)>;

  // patches: bf16 bits [n_h * n_w, 3 * patch * patch] (image/processor.h); returns [n_h * n_w, dim].
  std::vector<float> forward(std::span<const uint16_t> patches, int n_h, int n_w, const ops::KernelSet& ks,
                             ThreadPool* pool, const Observer& observe = {}) const;

  const VisionConfig& config() const { return config_; }

 private:
  VisionTower(const VisionConfig& config) : config_(config) {}
  VisionConfig config_;
  VisionTensorStore store_;
  ops::Bf16Weight patch_embed_;
  const uint16_t* patch_embed_bias_ = nullptr;
  std::vector<VisionBlock> blocks_;
  const uint16_t* norm_ = nullptr;
};

}  // namespace cedar::model
