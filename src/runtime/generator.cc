#include "runtime/generator.h"

#include <algorithm>

#include "core/timer.h"
#include "ops/logprob.h"

namespace cedar::runtime {

Result<std::vector<int32_t>> generate(model::Model& model, std::span<const int32_t> prompt,
                                      const GenerateOptions& options,
                                      const std::function<bool(int32_t)>& on_token, GenerateStats* stats,
                                      ThreadPool* pool) {
  if (prompt.empty()) return invalid_argument("generate: the prompt is empty");
  if (options.max_new_tokens < 0) return invalid_argument("generate: max_new_tokens must be >= 0");
  if (options.top_logprobs < 0) return invalid_argument("generate: top_logprobs must be >= 0");
  const size_t vocab = model.config().vocab_size;
  model::SequenceState seq = model.new_sequence(static_cast<int64_t>(prompt.size()) + options.max_new_tokens + 1);
  std::vector<float> logits(vocab);
  ops::SampleRng rng(options.seed);
  GenerateStats local;
  GenerateStats& st = stats ? *stats : local;
  st.prompt_tokens = static_cast<int>(prompt.size());

  Timer timer;
  size_t start = 0;
  if (options.prefix_store) {
    CEDAR_ASSIGN_OR_RETURN(ResumePlan rp, options.prefix_store->restore(prompt, options.replay, seq));
    st.cached_tokens = rp.cached_tokens;
    st.replayed_tokens = rp.replayed_tokens();
    start = static_cast<size_t>(rp.replay_from);
  }
  st.computed_tokens = static_cast<int64_t>(prompt.size() - start);
  const size_t chunk = options.prefill_chunk && start == 0 ? options.prefill_chunk : prompt.size();
  for (size_t pos = start; pos < prompt.size(); pos += chunk) {
    const size_t n = std::min(chunk, prompt.size() - pos);
    model::SeqChunk c{&seq, prompt.subspan(pos, n)};
    CEDAR_RETURN_IF_ERROR(model.forward({&c, 1}, logits.data(), pool));
  }
  st.prefill_seconds = timer.seconds();
  st.first_logits = logits;

  std::vector<int32_t> out;
  out.reserve(options.max_new_tokens);
  TokenLogprobs& lp = st.logprobs;
  const size_t top_k = std::min<size_t>(static_cast<size_t>(options.top_logprobs), model.sampleable_vocab());
  lp = TokenLogprobs{};
  if (options.top_logprobs > 0) {
    lp.k = static_cast<int>(top_k);
    lp.logprob.reserve(options.max_new_tokens);
    lp.top_ids.reserve(options.max_new_tokens * top_k);
    lp.top_logprobs.reserve(options.max_new_tokens * top_k);
  }
  timer.reset();
  const int32_t eos = model.config().eos_token_id;
  for (int i = 0; i < options.max_new_tokens; ++i) {
    st.last_logits.assign(logits.begin(), logits.end());
    const int32_t next = ops::sample_token(logits.data(), model.sampleable_vocab(), options.temperature, rng);
    out.push_back(next);
    if (top_k > 0) {
      const size_t at = lp.top_ids.size();
      lp.top_ids.resize(at + top_k);  // within the reserved capacity
      lp.top_logprobs.resize(at + top_k);
      lp.logprob.push_back(ops::token_logprobs(logits.data(), model.sampleable_vocab(), next, top_k,
                                               lp.top_ids.data() + at, lp.top_logprobs.data() + at));
    }
    const bool keep_going = !on_token || on_token(next);
    if (!keep_going || (options.stop_at_eos && next == eos) || i + 1 == options.max_new_tokens) break;
    model::SeqChunk c{&seq, {&out.back(), 1}};
    CEDAR_RETURN_IF_ERROR(model.forward({&c, 1}, logits.data(), pool));
  }
  st.decode_seconds = timer.seconds();
  st.new_tokens = static_cast<int>(out.size());
  if (options.prefix_store) CEDAR_RETURN_IF_ERROR(options.prefix_store->save(seq, static_cast<int64_t>(prompt.size())));
  return out;
}

}  // namespace cedar::runtime
