// model.py MoE with its Gate and Experts: the router picks each token's experts, the routed experts
// run grouped by id over the tokens that chose them (from the WeightSource: mapped, or streamed in
// groups of max_held()), the shared expert runs on every token, and each token sums its experts'
// outputs in ascending id order, then the shared expert's, in fp32. Expert parallelism and the
// look-ahead prefetch are strategies chosen when the model is built (remote_experts.h,
// expert_lookahead.h). One instance serves every layer; its scratch is reused.
#pragma once

#include <cstdint>
#include <vector>

#include "model/expert_exchange.h"
#include "model/expert_lookahead.h"
#include "model/forward_batch.h"
#include "model/remote_experts.h"
#include "ops/linear/linear.h"

namespace cedar::model {

// model.py Gate: fp32 logits, sqrt-softplus scores, top-k chosen with the bias (bias_vl on image
// rows), weights renormalised without it and scaled by route_scale.
class Gate {
 public:
  explicit Gate(const ModelParts& m) : m_(m) {}
  // ids, weights [T, K] of layer l's router on x [T, dim].
  void forward(int l, const Batch& b, const float* x, int32_t* ids, float* weights);

 private:
  const ModelParts& m_;
  std::vector<float> logits_;
};

class MoE {
 public:
  MoE(const ModelParts& m, bool lookahead) : m_(m), gate_(m), lookahead_(m, lookahead) {}
  // Expert parallelism: routed experts other ranks own go through `exchange` (null: all local).
  void set_expert_exchange(ExpertExchange* exchange, Status* error) { remote_.set(exchange, error); }
  void forward(int l, const Batch& b, const float* x, float* out);
  // A worker's step: the batch's experts, outputs [rows, dim] into out (model_experts.cc).
  void serve_batch(const ExpertBatch& batch, const ops::KernelSet& k, ThreadPool* pool, std::vector<float>& out);
  ExpertLookahead& lookahead() { return lookahead_; }

 private:
  // The routed experts `local_` (entries of rows_.experts) on x: row i reads x's row tokens[i], is
  // scaled by row_w[i] and writes ye's row i. xq: x quantised whole, for experts every token chose
  // (nullptr: quantise each expert's rows).
  void routed_experts(int l, const ops::KernelSet& k, ThreadPool* pool, const float* x, size_t n_tokens,
                      const int32_t* tokens, const float* row_w, const ops::PreparedActivations* xq, float* ye);

  const ModelParts& m_;
  Gate gate_;
  ExpertLookahead lookahead_;
  RemoteExperts remote_;
  RoutedRows rows_;
  std::vector<size_t> local_;     // active experts computed here (indices into rows_.experts)
  std::vector<int32_t> local_ids_;
  std::vector<float> act_, shared_act_, expert_act_;
  std::vector<float> x_rows_, g_, u_, ye_, acc_, shared_g_, shared_u_, shared_out_;
  std::vector<ExpertWeights> held_;  // weights of the group being computed
  std::vector<ops::Fp4GemmJob> fp4_jobs_;
  std::vector<ops::Fp8LinearJob> fp8_jobs_;
};

}  // namespace cedar::model
