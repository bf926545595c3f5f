// Look-ahead prefetch of routed experts (docs/STREAMING.md), a strategy of model.py MoE (moe.h)
// chosen when the model is built: only a streaming model with ResidencyOptions::lookahead runs it.
// Layer l+1's router applied to layer l's FFN input guesses the experts layer l+1 will choose (the
// residual stream changes little in one layer), so their reads start a layer early. Support, not a
// model.py class.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/forward_batch.h"

namespace cedar::model {

class ExpertLookahead {
 public:
  ExpertLookahead(const ModelParts& m, bool enabled) : m_(m), enabled_(enabled) {}
  // Guesses layer l+1's experts from x [T, dim] and hints the source (decode-sized batches only: a
  // prefill chunk needs nearly every expert anyway).
  void predict(int l, const Batch& b, const float* x);
  // Counts the previous guess against layer l's chosen experts (ascending ids).
  void score(int l, std::span<const int32_t> chosen);
  uint64_t predicted() const { return predicted_; }
  uint64_t correct() const { return correct_; }
  void reset() { predicted_ = correct_ = 0; }

 private:
  static constexpr size_t kMaxTokens = 8;
  const ModelParts& m_;
  bool enabled_;
  int layer_ = -1;  // the layer the guess is for
  std::vector<float> logits_, weights_;
  std::vector<int32_t> ids_, list_;
  std::vector<uint8_t> guessed_;  // [n_routed_experts]
  uint64_t predicted_ = 0, correct_ = 0;
};

}  // namespace cedar::model
