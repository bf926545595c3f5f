#include "model/vision_aligner.h"

#include <cmath>

#include "core/check.h"
#include "ops/formats/formats.h"

namespace cedar::model {

Result<std::unique_ptr<VisionAligner>> VisionAligner::bind(const ModelConfig& config, const WeightMap& map) {
  if (!config.vision.present) return failed_precondition("this checkpoint has no vision tower: no aligner");
  std::unique_ptr<VisionAligner> a(new VisionAligner());
  a->vision_dim_ = config.vision.dim;
  a->downsample_ = config.vision.downsample;
  a->w1_ = a->store_.linear(map, "aligner.w1.weight");
  a->b1_ = a->store_.bf16(map, "aligner.w1.bias");
  a->w2_ = a->store_.linear(map, "aligner.w2.weight");
  a->b2_ = a->store_.bf16(map, "aligner.w2.bias");
  return a;
}

std::vector<float> VisionAligner::forward(std::span<const float> x, int n_h, int n_w, const ops::KernelSet& ks,
                                          ThreadPool* pool) const {
  const size_t c = static_cast<size_t>(vision_dim_), r = static_cast<size_t>(downsample_);
  CEDAR_CHECK(x.size() == static_cast<size_t>(n_h) * n_w * c, "VisionAligner::forward: input does not match the grid");
  const size_t g_h = (n_h + r - 1) / r, g_w = (n_w + r - 1) / r, cells = g_h * g_w, in_dim = c * r * r;
  std::vector<float> merged(cells * in_dim, 0.0f);  // the zero padding of F.pad
  for (size_t bh = 0; bh < g_h; ++bh) {
    for (size_t bw = 0; bw < g_w; ++bw) {
      float* dst = merged.data() + (bh * g_w + bw) * in_dim;
      for (size_t ki = 0; ki < r; ++ki) {
        for (size_t kj = 0; kj < r; ++kj) {
          const size_t row = bh * r + ki, col = bw * r + kj;
          if (row >= static_cast<size_t>(n_h) || col >= static_cast<size_t>(n_w)) continue;
          const float* src = x.data() + (row * n_w + col) * c;
          for (size_t ch = 0; ch < c; ++ch) dst[ch * r * r + ki * r + kj] = src[ch];
        }
      }
    }
  }
  std::vector<float> hidden(cells * w1_.n), out(cells * w2_.n);
  vision_linear_bias(ks, merged.data(), cells, w1_, b1_, hidden.data(), pool);
  for (float& h : hidden) {  // F.gelu (erf) on bf16: in double, rounded to f32, then to bf16
    const double xd = h;
    h = ops::round_bf16(static_cast<float>(0.5 * xd * (1.0 + std::erf(xd / std::sqrt(2.0)))));
  }
  vision_linear_bias(ks, hidden.data(), cells, w2_, b2_, out.data(), pool);
  return out;
}

}  // namespace cedar::model
