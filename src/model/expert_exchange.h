// ExpertExchange: routed experts computed by other processes (expert parallelism, docs/DISTRIBUTED.md).
// The model defines the contract and never sees the transport; src/dist implements it over MPI.
//
// Head (rank 0), per MoE layer of a forward pass: post() the rows of every expert another rank owns
// (all tokens of the batch step in one request per rank), compute the shared expert and its own
// experts meanwhile, then collect() each rank's per-(token, expert) outputs, NOT summed, so that the
// head adds every token's experts in the single-process order (bit-identical in exact numerics).
// Worker (rank > 0): Model::serve_experts loops on next() / reply() until the head says stop.
//
// Errors (a dead, hung or unreachable rank; every wait is bounded by the exchange's timeout) are
// returned as a Status naming the rank and its host; the model keeps the first one (sticky), fails
// the forward pass with it and sends no further requests.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace cedar::model {

// One rank's share of one MoE layer. Experts ascending; each expert's rows in token order.
struct ExpertBatch {
  int32_t layer = 0;
  int32_t n_tokens = 0;                  // distinct tokens whose activations travel
  std::vector<int32_t> experts, counts;  // counts[j]: rows of experts[j]
  std::vector<int32_t> row_token;        // [rows] index into the batch's tokens
  std::vector<float> row_weight;         // [rows] the routing weight of the row
  std::vector<float> x;                  // [n_tokens, dim] the FFN input rows (fp32)
  size_t rows() const { return row_token.size(); }
  void clear() {
    n_tokens = 0;
    experts.clear();
    counts.clear();
    row_token.clear();
    row_weight.clear();
    x.clear();
  }
};

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int rank() const = 0;
  virtual int n_ranks() const = 0;
  // The rank that computes routed expert `expert` of backbone layer `layer`.
  virtual int owner(int layer, int expert) const = 0;

  // Head: sends per_rank[r] to every rank r != rank() whose batch has rows (without waiting for them
  // to arrive); then collect(r, ...) waits for rank r's outputs, [rows, dim] fp32 in the batch's row order.
  virtual Status post(std::span<const ExpertBatch> per_rank) = 0;
  virtual Status collect(int rank, std::span<float> out) = 0;

  // Worker: the next request into `batch` (false: the head said stop), then its outputs.
  virtual Result<bool> next(ExpertBatch& batch) = 0;
  virtual Status reply(std::span<const float> out) = 0;
};

}  // namespace cedar::model
