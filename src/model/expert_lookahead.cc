#include "model/expert_lookahead.h"

#include "ops/linear/linear.h"
#include "ops/block/moe.h"

namespace cedar::model {

void ExpertLookahead::predict(int l, const Batch& b, const float* x) {
  layer_ = -1;
  if (!enabled_ || l + 1 >= m_.c.n_layers || b.T > kMaxTokens) return;
  const LayerPlanEntry& e = m_.plan.layers[l + 1];
  const BlockWeights& bw = m_.w.blocks[l + 1];
  const size_t E = e.n_routed_experts, K = e.n_activated_experts, T = b.T;
  float* logits = scratch(logits_, T * E);
  b.k.linear_bf16(x, T, bw.gate, logits, ops::LinearOut::kF32, b.pool);
  int32_t* ids = scratch(ids_, T * K);
  float* wts = scratch(weights_, T * K);
  guessed_.assign(E, 0);  // capacity kept: no allocation after the first step
  for (size_t t = 0; t < T; ++t) {
    ops::route_sqrt_softplus(logits + t * E, bw.gate_bias, E, K, static_cast<float>(m_.c.route_scale), ids + t * K,
                             wts + t * K);
    for (size_t k = 0; k < K; ++k) guessed_[ids[t * K + k]] = 1;
  }
  list_.clear();
  for (size_t ex = 0; ex < E; ++ex)
    if (guessed_[ex]) list_.push_back(static_cast<int32_t>(ex));
  layer_ = l + 1;
  m_.source.hint(l + 1, list_);
}

// Precision of the previous layer's guess: guessed experts that this layer's router chose.
void ExpertLookahead::score(int l, std::span<const int32_t> chosen) {
  if (layer_ != l) return;
  size_t hit = 0;
  for (int32_t ex : chosen) hit += guessed_[ex];
  predicted_ += list_.size();
  correct_ += hit;
  layer_ = -1;
}

}  // namespace cedar::model
