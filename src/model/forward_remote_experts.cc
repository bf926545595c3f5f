// Expert parallelism in the forward pass (docs/DISTRIBUTED.md): the head's side of a MoE layer's
// exchange (post the rows of experts other ranks own, collect their per-row outputs) and a worker's
// side (compute a request's experts exactly as the head would). The transport is the ExpertExchange
// the distributed module implements; nothing here knows about MPI.
#include <algorithm>
#include <cstring>

#include "model/forward_internal.h"

namespace cedar::model {

bool ForwardPass::post_remote_experts(int l, const float* x, const int32_t* tokens, const float* row_w) {
  ExpertExchange& xch = *m_.exchange_;
  const size_t dim = c_.dim;
  const int n_ranks = xch.n_ranks(), self = xch.rank();
  ws_.moe_remote.resize(n_ranks);
  ws_.moe_remote_experts.resize(n_ranks);
  for (int r = 0; r < n_ranks; ++r) {
    ws_.moe_remote[r].clear();
    ws_.moe_remote[r].layer = l;
    ws_.moe_remote_experts[r].clear();
  }
  int32_t* token_slot = scratch(ws_.moe_token_slot, T_);
  bool any = false;
  for (int r = 0; r < n_ranks; ++r) {
    if (r == self) continue;
    ExpertBatch& b = ws_.moe_remote[r];
    std::fill(token_slot, token_slot + T_, -1);
    for (size_t j = 0; j < ws_.moe_experts.size(); ++j) {
      const auto& ae = ws_.moe_experts[j];
      if (xch.owner(l, ae.expert) != r) continue;
      ws_.moe_remote_experts[r].push_back(j);
      b.experts.push_back(ae.expert);
      b.counts.push_back(static_cast<int32_t>(ae.rows));
      for (size_t i = ae.row0; i < ae.row0 + ae.rows; ++i) {
        int32_t& slot = token_slot[tokens[i]];
        if (slot < 0) {  // each token's activation travels once per rank, however many of its experts live there
          slot = b.n_tokens++;
          b.x.insert(b.x.end(), x + tokens[i] * dim, x + (tokens[i] + 1) * dim);
        }
        b.row_token.push_back(slot);
        b.row_weight.push_back(row_w[i]);
      }
    }
    any = any || b.rows() > 0;
  }
  if (!any) return false;
  if (!m_.exchange_error_.ok()) return true;  // a rank failed earlier: this pass's output is void anyway
  Status st = xch.post(ws_.moe_remote);
  if (!st.ok()) m_.exchange_error_ = st;
  return true;
}

void ForwardPass::collect_remote_experts(float* ye) {
  ExpertExchange& xch = *m_.exchange_;
  const size_t dim = c_.dim;
  for (int r = 0; r < xch.n_ranks(); ++r) {
    const ExpertBatch& b = ws_.moe_remote[r];
    if (r == xch.rank() || b.rows() == 0) continue;
    float* out = scratch(ws_.moe_remote_out, b.rows() * dim);
    if (m_.exchange_error_.ok()) {
      Status st = xch.collect(r, {out, b.rows() * dim});
      if (!st.ok()) m_.exchange_error_ = st;
    }
    if (!m_.exchange_error_.ok()) std::memset(out, 0, b.rows() * dim * sizeof(float));
    // The reply's rows are the batch's: its experts ascending, each expert's rows in order.
    size_t at = 0;
    for (size_t j : ws_.moe_remote_experts[r]) {
      const auto& ae = ws_.moe_experts[j];
      std::memcpy(ye + ae.row0 * dim, out + at * dim, ae.rows * dim * sizeof(float));
      at += ae.rows;
    }
  }
}

void ForwardPass::serve_batch(const ExpertBatch& b, std::vector<float>& out) {
  const size_t dim = c_.dim, rows = b.rows();
  ws_.moe_experts.clear();
  ws_.moe_local.clear();
  ws_.moe_local_ids.clear();
  size_t row = 0;
  for (size_t j = 0; j < b.experts.size(); ++j) {
    ws_.moe_experts.push_back({b.experts[j], row, static_cast<size_t>(b.counts[j]), 0});
    ws_.moe_local.push_back(j);
    ws_.moe_local_ids.push_back(b.experts[j]);
    row += static_cast<size_t>(b.counts[j]);
  }
  out.resize(rows * dim);
  // Per-row quantisation: each expert's gathered rows give the head's values bit for bit.
  routed_experts(b.layer, b.x.data(), static_cast<size_t>(b.n_tokens), b.row_token.data(), b.row_weight.data(),
                 nullptr, out.data());
}

Status Model::serve_experts(ExpertExchange& exchange, ThreadPool* pool) {
  ExpertBatch batch;
  std::vector<float> out;
  std::vector<ChunkSpan> no_chunks;
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
    ForwardPass pass(*this, no_chunks, 0, pool);
    pass.serve_batch(batch, out);
    CEDAR_RETURN_IF_ERROR(exchange.reply(out));
  }
}

}  // namespace cedar::model
