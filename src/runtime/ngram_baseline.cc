#include "runtime/ngram_baseline.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace cedar::runtime {

NgramBaseline::NgramBaseline(const std::vector<std::vector<int32_t>>& docs, size_t vocab)
    : vocab_(vocab), unigram_(vocab, 0), predecessors_(vocab, 0) {
  std::map<std::pair<int32_t, int32_t>, uint32_t> pairs;
  for (const auto& d : docs)
    for (size_t j = 1; j < d.size(); ++j) {
      if (d[j] < 0 || static_cast<size_t>(d[j]) >= vocab) continue;  // not a predictable id
      ++unigram_[d[j]];
      ++n_targets_;
      ++pairs[{d[j - 1], d[j]}];
    }
  for (const auto& [uw, c] : pairs) {
    Successors& s = bigram_[uw.first];
    s.total += c;
    s.next.emplace_back(uw.second, c);  // std::map order: sorted by w within u
    ++predecessors_[uw.second];
  }
  n_bigrams_ = pairs.size();
  for (size_t w = 1; w < vocab; ++w)
    if (unigram_[w] > unigram_[unigram_best_]) unigram_best_ = static_cast<int32_t>(w);
  by_continuation_.resize(vocab);
  for (size_t w = 0; w < vocab; ++w) by_continuation_[w] = static_cast<int32_t>(w);
  std::stable_sort(by_continuation_.begin(), by_continuation_.end(),
                   [&](int32_t a, int32_t b) { return predecessors_[a] > predecessors_[b]; });
}

double NgramBaseline::unigram_logprob(int32_t w) const {
  const double c = static_cast<size_t>(w) < vocab_ && w >= 0 ? static_cast<double>(unigram_[w]) : 0.0;
  return std::log((c + 1.0) / (static_cast<double>(n_targets_) + static_cast<double>(vocab_)));
}

double NgramBaseline::continuation(int32_t w) const {
  const double m = static_cast<size_t>(w) < vocab_ && w >= 0 ? static_cast<double>(predecessors_[w]) : 0.0;
  return (m + 1.0) / (static_cast<double>(n_bigrams_) + static_cast<double>(vocab_));
}

uint32_t NgramBaseline::count(const Successors& s, int32_t w) const {
  auto it = std::lower_bound(s.next.begin(), s.next.end(), std::pair<int32_t, uint32_t>(w, 0));
  return it != s.next.end() && it->first == w ? it->second : 0;
}

double NgramBaseline::bigram_logprob(int32_t u, int32_t w) const {
  auto it = bigram_.find(u);
  if (it == bigram_.end()) return std::log(continuation(w));
  const Successors& s = it->second;
  const double cu = static_cast<double>(s.total);
  const double c = count(s, w);
  const double p = std::max(c - kDiscount, 0.0) / cu +
                   kDiscount * static_cast<double>(s.next.size()) / cu * continuation(w);
  return std::log(p);
}

int32_t NgramBaseline::bigram_argmax(int32_t u) const {
  auto it = bigram_.find(u);
  if (it == bigram_.end()) return by_continuation_.empty() ? 0 : by_continuation_[0];
  const Successors& s = it->second;
  // The best unseen successor is the first id by continuation not among the seen ones; the answer is
  // it or one of the seen successors.
  int32_t best = -1;
  double best_p = -1;
  auto consider = [&](int32_t w) {
    const double p = std::exp(bigram_logprob(u, w));
    if (p > best_p || (p == best_p && w < best)) {
      best = w;
      best_p = p;
    }
  };
  for (const auto& [w, c] : s.next) consider(w);
  for (int32_t w : by_continuation_)
    if (count(s, w) == 0) {
      consider(w);
      // Equal continuation values with lower ids come first in by_continuation_, so no later unseen
      // id can win a tie against this one.
      break;
    }
  return best;
}

}  // namespace cedar::runtime
