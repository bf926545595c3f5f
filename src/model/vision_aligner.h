// The Aligner of inference/vision.py: the ViT's [n_h, n_w, dim] output, zero-padded right and bottom
// to multiples of the downsample ratio r, merged r x r (F.unfold order: feature c * r * r + ki * r + kj,
// blocks in reading order), then w2(gelu(w1(.))) into the LLM's width. Exact GELU (erf) computed in
// double and rounded once; linears with bias as in vision_tower.h.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "model/vision_tower.h"

namespace cedar::model {

class VisionAligner {
 public:
  static Result<std::unique_ptr<VisionAligner>> bind(const ModelConfig& config, const WeightMap& map);

  // x: [n_h * n_w, vision dim] (VisionTower::forward); returns [ceil(n_h/r) * ceil(n_w/r), llm dim].
  std::vector<float> forward(std::span<const float> x, int n_h, int n_w, const ops::KernelSet& ks,
                             ThreadPool* pool) const;

 private:
  VisionAligner() = default;
  int vision_dim_ = 0, downsample_ = 0;
  VisionTensorStore store_;
  ops::Bf16Weight w1_, w2_;
  const uint16_t* b1_ = nullptr;
  const uint16_t* b2_ = nullptr;
};

}  // namespace cedar::model
