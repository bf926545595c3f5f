#include "model/remote_experts.h"

#include <algorithm>
#include <cstring>

namespace cedar::model {

bool RemoteExperts::post(int l, const float* x, size_t T, size_t dim, const RoutedRows& rr) {
  const int n_ranks = xch_->n_ranks(), self = xch_->rank();
  requests_.resize(n_ranks);
  rank_experts_.resize(n_ranks);
  for (int r = 0; r < n_ranks; ++r) {
    requests_[r].clear();
    requests_[r].layer = l;
    rank_experts_[r].clear();
  }
  if (token_slot_.size() < T) token_slot_.resize(T);
  int32_t* token_slot = token_slot_.data();
  bool any = false;
  for (int r = 0; r < n_ranks; ++r) {
    if (r == self) continue;
    ExpertBatch& b = requests_[r];
    std::fill(token_slot, token_slot + T, -1);
    for (size_t j = 0; j < rr.experts.size(); ++j) {
      const ActiveExpert& ae = rr.experts[j];
      if (xch_->owner(l, ae.expert) != r) continue;
      rank_experts_[r].push_back(j);
      b.experts.push_back(ae.expert);
      b.counts.push_back(static_cast<int32_t>(ae.rows));
      for (size_t i = ae.row0; i < ae.row0 + ae.rows; ++i) {
        const int32_t t = rr.tokens[i];
        int32_t& slot = token_slot[t];
        if (slot < 0) {  // each token's activation travels once per rank, however many of its experts live there
          slot = b.n_tokens++;
          b.x.insert(b.x.end(), x + t * dim, x + (t + 1) * dim);
        }
        b.row_token.push_back(slot);
        b.row_weight.push_back(rr.row_w[i]);
      }
    }
    any = any || b.rows() > 0;
  }
  if (!any) return false;
  if (!error_->ok()) return true;  // a rank failed earlier: this pass's output is void anyway
  Status st = xch_->post(requests_);
  if (!st.ok()) *error_ = st;
  return true;
}

void RemoteExperts::collect(const RoutedRows& rr, size_t dim, float* ye) {
  for (int r = 0; r < xch_->n_ranks(); ++r) {
    const ExpertBatch& b = requests_[r];
    if (r == xch_->rank() || b.rows() == 0) continue;
    if (reply_.size() < b.rows() * dim) reply_.resize(b.rows() * dim);
    float* out = reply_.data();
    if (error_->ok()) {
      Status st = xch_->collect(r, {out, b.rows() * dim});
      if (!st.ok()) *error_ = st;
    }
    if (!error_->ok()) std::memset(out, 0, b.rows() * dim * sizeof(float));
    // The reply's rows are the batch's: its experts ascending, each expert's rows in order.
    size_t at = 0;
    for (size_t j : rank_experts_[r]) {
      const ActiveExpert& ae = rr.experts[j];
      std::memcpy(ye + ae.row0 * dim, out + at * dim, ae.rows * dim * sizeof(float));
      at += ae.rows;
    }
  }
}

}  // namespace cedar::model
