// Log-probabilities of fp32 logits, for scoring text (`cedar eval`) and reporting the top choices of
// every generated token (`cedar generate --top-logprobs`). Scalar code; no allocation.
//
//   log p_i = (x_i - m) - log(sum_j exp(x_j - m)),   m = max_j x_j
// with every difference, exp, sum and log in double (the fp32 logits are exact in double), so the
// result is the fp32 model's log-softmax to double accuracy. Only the first n logits count (the
// sampleable vocabulary, model::Model::sampleable_vocab).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops {

struct LogSoftmaxNorm {
  float max = 0;        // m
  double log_sum = 0;   // log(sum_j exp(x_j - m))
  double log_prob(const float* logits, int32_t i) const {
    return (static_cast<double>(logits[i]) - static_cast<double>(max)) - log_sum;
  }
};

// The normaliser of logits[0, n). n > 0; the logits must be finite.
LogSoftmaxNorm log_softmax_norm(const float* logits, size_t n);

// The ids of the k largest logits of logits[0, n), largest first; equal logits: the lower id first
// (so ids[0] is ops::argmax). Writes min(k, n) ids and returns that count.
size_t top_k_ids(const float* logits, size_t n, size_t k, int32_t* ids);

// What `cedar generate --top-logprobs` and the engine's per-token logprobs report for one sampled
// token: its log-probability and the k most probable ids (top_k_ids order) with theirs, all under
// the log-softmax of logits[0, n). Writes k entries to top_ids / top_logprobs; no allocation.
// Returns the sampled token's log-probability.
float token_logprobs(const float* logits, size_t n, int32_t sampled, size_t k, int32_t* top_ids,
                     float* top_logprobs);

}  // namespace cedar::ops
