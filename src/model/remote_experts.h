// Expert parallelism in the forward pass (docs/DISTRIBUTED.md): the head's side of a MoE layer's
// exchange, posting the rows of experts other ranks own and collecting their per-row outputs. The
// transport is the ExpertExchange the distributed module implements; nothing here knows about MPI.
// Support for model.py MoE (moe.h), not a model.py class.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/expert_exchange.h"

namespace cedar::model {

// The rows of a MoE layer's chosen experts, grouped by expert id (ascending): experts[j] owns rows
// [row0, row0 + rows) of the [T*K, ...] expert buffers, token by token in order.
struct ActiveExpert {
  int32_t expert;
  size_t row0, rows;
  size_t act_offset;  // its activation scratch (MoE::routed_experts)
};
struct RoutedRows {
  std::vector<ActiveExpert> experts;
  std::vector<int32_t> ids;            // experts' ids, ascending
  std::vector<int32_t> chosen;         // [T, K] the router's choice
  std::vector<float> weights;          // [T, K] its weights
  std::vector<int32_t> tokens, slots;  // [T*K] row -> token, row -> selection slot
  std::vector<float> row_w;            // [T*K] routing weight of each row
};

class RemoteExperts {
 public:
  void set(ExpertExchange* exchange, Status* error) {
    xch_ = exchange;
    error_ = error;
  }
  bool active() const { return xch_ != nullptr && xch_->n_ranks() > 1; }
  // Whether this rank computes `expert` of layer l.
  bool local(int l, int32_t expert) const { return !active() || xch_->owner(l, expert) == xch_->rank(); }
  // Sends the rows of the experts other ranks own (x [T, dim]); false when nothing was sent.
  bool post(int l, const float* x, size_t T, size_t dim, const RoutedRows& r);
  // Copies their outputs into ye's rows (zeros once the exchange has failed: the pass is void).
  void collect(const RoutedRows& r, size_t dim, float* ye);

 private:
  ExpertExchange* xch_ = nullptr;
  Status* error_ = nullptr;  // the model's exchange_error
  std::vector<ExpertBatch> requests_;               // per rank
  std::vector<std::vector<size_t>> rank_experts_;  // per rank: which entries of RoutedRows::experts
  std::vector<int32_t> token_slot_;                 // [T] a token's index in the request being built
  std::vector<float> reply_;
};

}  // namespace cedar::model
