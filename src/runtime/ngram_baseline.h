// The unigram and bigram baselines `cedar eval` reports beside the model (docs/EVAL.md): estimated
// from training documents, scored on held-out ones over the same targets as the model (every token
// of a document after its first).
//
//   unigram  add-one:  p(w) = (c(w) + 1) / (N + V)
//   bigram   interpolated Kneser-Ney, one discount D = 0.75:
//              p(w | u) = max(c(u,w) - D, 0) / c(u) + D * n(u) / c(u) * q(w)   when c(u) > 0
//              p(w | u) = q(w)                                                   when c(u) = 0
//            q(w) = (m(w) + 1) / (B + V), the continuation distribution with add-one
// where c counts targets (w) and bigrams (u, w) in the training documents, N = the number of targets,
// n(u) = the distinct successors of u, m(w) = the distinct predecessors of w, B = the distinct bigrams
// and V = the vocabulary (the sampleable ids). Top-1 is the most probable id (ties: the lower id).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace cedar::runtime {

class NgramBaseline {
 public:
  static constexpr double kDiscount = 0.75;
  // docs: token ids, each starting with its first token (BOS when the tokenizer adds one).
  NgramBaseline(const std::vector<std::vector<int32_t>>& docs, size_t vocab);

  double unigram_logprob(int32_t w) const;
  int32_t unigram_argmax() const { return unigram_best_; }
  double bigram_logprob(int32_t u, int32_t w) const;
  int32_t bigram_argmax(int32_t u) const;

  uint64_t targets() const { return n_targets_; }
  uint64_t distinct_bigrams() const { return n_bigrams_; }

 private:
  struct Successors {
    uint64_t total = 0;                              // c(u)
    std::vector<std::pair<int32_t, uint32_t>> next;  // (w, c(u,w)), sorted by w
  };
  double continuation(int32_t w) const;
  uint32_t count(const Successors& s, int32_t w) const;

  size_t vocab_;
  uint64_t n_targets_ = 0, n_bigrams_ = 0;
  std::vector<uint64_t> unigram_;      // c(w)
  std::vector<uint32_t> predecessors_; // m(w)
  std::unordered_map<int32_t, Successors> bigram_;
  std::vector<int32_t> by_continuation_;  // ids by q(w) descending, then id
  int32_t unigram_best_ = 0;
};

}  // namespace cedar::runtime
