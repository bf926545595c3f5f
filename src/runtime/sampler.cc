#include "runtime/sampler.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <string>

#include "core/timer.h"
#include "ops/sample/logprob.h"

namespace cedar::runtime {

bool apply_token_mask(const uint32_t* mask, float* logits, size_t n) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  bool any = false;
  for (size_t word = 0; word * 32 < n; ++word) {
    const uint32_t bits = mask[word];
    const size_t end = std::min(n, word * 32 + 32);
    const uint32_t in_range = end - word * 32 == 32 ? 0xFFFFFFFFu : (1u << (end - word * 32)) - 1u;
    any = any || (bits & in_range) != 0;
    if (bits == 0xFFFFFFFFu) continue;
    if (bits == 0) {  // most words of a narrow mask: a plain fill
      std::fill(logits + word * 32, logits + end, kMasked);
      continue;
    }
    for (size_t i = word * 32; i < end; ++i)
      if (!((bits >> (i - word * 32)) & 1u)) logits[i] = kMasked;
  }
  return any;
}

Sampler::Sampler(const GenerationRequest& request, size_t vocab, int32_t eos_id)
    : request_(request), vocab_(vocab), eos_id_(eos_id), rng_(request.sampling.seed) {}

Result<Sampler::Pick> Sampler::pick(float* row, const uint32_t* mask, int produced) {
  Pick pick;
  TokenConstraint* constraint = request_.constraint.get();
  Timer timer;
  if (constraint && mask && !apply_token_mask(mask, row, vocab_))
    // A grammar with no way on (a pattern such as `[^\s\S]`, or a dead end after some output): the
    // client's constraint cannot be met, which is its error, not the server's.
    return invalid_argument("the output constraint allows no token after " + std::to_string(produced) +
                            " output tokens: its schema or pattern cannot be completed");
  pick.token = ops::sample_token(row, vocab_, request_.sampling.temperature, rng_);
  if (!constraint) return pick;
  pick.constrained = true;
  // The constraint's calls may throw (std::bad_alloc in a matcher): that fails this request only.
  try {
    // Near max_tokens: a token after which the output could no longer be completed in time is
    // sampled again from the narrower mask (a subset of the applied one) the constraint gives.
    const int left_after = request_.sampling.max_tokens - produced - 1;
    if (const uint32_t* narrower = constraint->mask_to_finish_within(pick.token, left_after)) {
      apply_token_mask(narrower, row, vocab_);
      pick.token = ops::sample_token(row, vocab_, request_.sampling.temperature, rng_);
      pick.resampled = true;
    }
    if (!constraint->accept_token(pick.token))
      return internal_error("constrained decoding: the grammar rejected sampled token " + std::to_string(pick.token));
  } catch (const std::exception& e) {
    return internal_error(std::string("constrained decoding: ") + e.what());
  }
  pick.constraint_seconds = timer.seconds();
  return pick;
}

TokenLogprobsView Sampler::logprobs(const float* row, int32_t token) {
  const size_t k = std::min<size_t>(static_cast<size_t>(request_.top_logprobs), vocab_);
  TokenLogprobsView view;
  view.token = token;
  view.logprob = ops::token_logprobs(row, vocab_, token, k, top_ids_.data(), top_logprobs_.data());
  view.top_ids = {top_ids_.data(), k};
  view.top_logprobs = {top_logprobs_.data(), k};
  return view;
}

bool Sampler::is_stop(int32_t token) const {
  const auto& stops = request_.sampling.stop_ids;
  return (token == eos_id_ && !request_.sampling.ignore_eos) || std::find(stops.begin(), stops.end(), token) != stops.end();
}

}  // namespace cedar::runtime
