#include "ops/sample/logprob.h"

#include <cmath>

#include "core/check.h"

namespace cedar::ops {

LogSoftmaxNorm log_softmax_norm(const float* logits, size_t n) {
  CEDAR_CHECK(n > 0, "log_softmax of an empty array");
  LogSoftmaxNorm z;
  z.max = logits[0];
  for (size_t i = 1; i < n; ++i)
    if (logits[i] > z.max) z.max = logits[i];
  const double m = z.max;
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - m);
  z.log_sum = std::log(sum);
  return z;
}

size_t top_k_ids(const float* logits, size_t n, size_t k, int32_t* ids) {
  if (k > n) k = n;
  if (k == 0) return 0;
  // ids[0, have) sorted: larger logit first, then lower id. An insertion keeps it so; k is small.
  size_t have = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = logits[i];
    if (have == k && !(v > logits[ids[k - 1]])) continue;  // a tie with the last keeps the lower id
    size_t pos;
    if (have < k) pos = have++;  // a new slot at the end
    else pos = k - 1;            // the last one drops out
    while (pos > 0 && v > logits[ids[pos - 1]]) {
      ids[pos] = ids[pos - 1];
      --pos;
    }
    ids[pos] = static_cast<int32_t>(i);
  }
  return have;
}

float token_logprobs(const float* logits, size_t n, int32_t sampled, size_t k, int32_t* top_ids,
                     float* top_logprobs) {
  const LogSoftmaxNorm z = log_softmax_norm(logits, n);
  const size_t have = top_k_ids(logits, n, k, top_ids);
  for (size_t j = 0; j < have; ++j) top_logprobs[j] = static_cast<float>(z.log_prob(logits, top_ids[j]));
  return static_cast<float>(z.log_prob(logits, sampled));
}

}  // namespace cedar::ops
