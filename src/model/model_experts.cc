// Expert parallelism, a worker's side (docs/DISTRIBUTED.md): each request the head sends is checked
// against this model, then computed exactly as the head would (MoE::serve_batch). The head's side is
// remote_experts.h.
#include "model/transformer.h"

namespace cedar::model {

void MoE::serve_batch(const ExpertBatch& b, const ops::KernelSet& k, ThreadPool* pool, std::vector<float>& out) {
  rows_.experts.clear();
  local_.clear();
  local_ids_.clear();
  size_t row = 0;
  for (size_t j = 0; j < b.experts.size(); ++j) {
    rows_.experts.push_back({b.experts[j], row, static_cast<size_t>(b.counts[j]), 0});
    local_.push_back(j);
    local_ids_.push_back(b.experts[j]);
    row += static_cast<size_t>(b.counts[j]);
  }
  out.resize(b.rows() * m_.c.dim);
  // Per-row quantisation: each expert's gathered rows give the head's values bit for bit.
  routed_experts(b.layer, k, pool, b.x.data(), static_cast<size_t>(b.n_tokens), b.row_token.data(),
                 b.row_weight.data(), nullptr, out.data());
}

Status Model::serve_experts(ExpertExchange& exchange, ThreadPool* pool) {
  ExpertBatch batch;
  std::vector<float> out;
  for (;;) {
    CEDAR_ASSIGN_OR_RETURN(bool more, exchange.next(batch));
    if (!more) return {};
    // The request is checked against this model before any expert runs: a head with another
    // checkpoint or placement would otherwise read unmapped weights.
    const bool layer_ok = batch.layer >= 0 && batch.layer < config_.n_layers;
    const int E = layer_ok ? plan_.layers[batch.layer].n_routed_experts : 0;
    size_t rows = 0;
    bool ok = layer_ok && batch.experts.size() == batch.counts.size() && batch.n_tokens >= 0 &&
              batch.x.size() == static_cast<size_t>(batch.n_tokens) * config_.dim;
    for (size_t j = 0; ok && j < batch.experts.size(); ++j) {
      const int ex = batch.experts[j];
      ok = ex >= 0 && ex < E && (j == 0 || ex > batch.experts[j - 1]) && batch.counts[j] > 0 &&
           weights_->blocks[batch.layer].experts[ex].w1.packed != nullptr;
      rows += ok ? static_cast<size_t>(batch.counts[j]) : 0;
    }
    ok = ok && rows == batch.rows() && batch.row_weight.size() == rows;
    for (size_t i = 0; ok && i < rows; ++i) ok = batch.row_token[i] >= 0 && batch.row_token[i] < batch.n_tokens;
    if (!ok)
      return invalid_argument("expert worker: the head sent a request for layer " + std::to_string(batch.layer) +
                              " that does not match this rank's checkpoint or expert placement");
    transformer_->serve_batch(batch, kernels(), pool, out);
    CEDAR_RETURN_IF_ERROR(exchange.reply(out));
  }
}

}  // namespace cedar::model
