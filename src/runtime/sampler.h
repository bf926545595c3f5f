// Sampler: how one request's next token is chosen from its step's logits. The engine's one place
// for it: the output constraint's mask, the seeded sampling of ops::sample_token (greedy at
// temperature 0), the budget-aware closing of a constraint near max_tokens, the token's
// log-probabilities, and the stop rule. No allocation per token: the buffers are the sampler's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "ops/sample/sample.h"
#include "runtime/engine.h"

namespace cedar::runtime {

// Gives the logits of the tokens `mask` (TokenConstraint::next_token_mask) does not allow -inf, so
// neither argmax nor the exponential race can pick them. Returns whether any of the first `n`
// tokens is allowed.
bool apply_token_mask(const uint32_t* mask, float* logits, size_t n);

class Sampler {
 public:
  // `request` must outlive the sampler; `vocab` is the sampleable vocabulary (Model::sampleable_vocab).
  Sampler(const GenerationRequest& request, size_t vocab, int32_t eos_id);

  struct Pick {
    int32_t token = 0;
    bool constrained = false;       // sampled under a mask
    bool resampled = false;         // sampled again from the constraint's narrower closing mask
    double constraint_seconds = 0;  // masking and advancing the constraint (the per-token overhead)
  };
  // Samples the next token from `row` (modified in place: masked). `mask` is the constraint's mask
  // for this token (nullptr: no mask), `produced` the tokens the request has output so far. Errors
  // end the request: InvalidArgument when the constraint allows nothing (its client's schema cannot
  // be completed), Internal when the constraint fails or rejects the token.
  Result<Pick> pick(float* row, const uint32_t* mask, int produced);
  // The log-probabilities of `token` under `row` (after pick(): the masked row is the distribution
  // sampled from, so tokens the grammar forbids have none). Valid until the next call.
  TokenLogprobsView logprobs(const float* row, int32_t token);
  // Whether `token` ends the request (EOS or one of its stop ids).
  bool is_stop(int32_t token) const;

 private:
  const GenerationRequest& request_;
  const size_t vocab_;
  const int32_t eos_id_;
  ops::SampleRng rng_;
  std::array<int32_t, kMaxTopLogprobs> top_ids_{};
  std::array<float, kMaxTopLogprobs> top_logprobs_{};
};

}  // namespace cedar::runtime
