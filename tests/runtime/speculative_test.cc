// Speculative decoding (runtime/speculative.h) in cedar's one decode loop: greedy ids with the DSpark
// draft equal plain decoding bit for bit in exact numerics, across EOS, stop ids, max_tokens,
// cancellation and the context limit; speculative rejection sampling keeps the model's distribution
// (chi-square); the guard stops drafting when drafts do not pay.
#include "runtime/speculative.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "ops/sample/sample.h"
#include "runtime/local_engine.h"
#include "runtime/sampler.h"
#include "../model/tiny_model_util.h"

namespace cedar::runtime {
namespace {

std::unique_ptr<Engine> tiny_engine(uint64_t seed, SpeculativeMode mode, bool guard = false, int max_context = 8192) {
  EngineOptions o;
  o.threads = 2;
  o.prefix_cache = false;
  o.speculative = mode;
  o.speculative_guard = guard;
  o.max_context = max_context;
  auto engine = make_engine(model::testing::tiny_checkpoint(seed), o);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return engine.ok() ? std::move(*engine) : nullptr;
}

GenerationResult run(Engine& engine, GenerationRequest r, int cancel_after = -1) {
  int seen = 0;
  auto out = runtime::generate(engine, std::move(r), [&](const GenerationStream::Update& u) {
    seen += static_cast<int>(u.tokens.size());
    return cancel_after < 0 || seen < cancel_after;
  });
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : GenerationResult{};
}

GenerationRequest greedy(uint32_t salt, int max_tokens) {
  GenerationRequest r;
  r.prompt_ids = model::testing::test_prompt(23, salt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.cache_prefix = false;
  return r;
}

// Every step verifies a whole block (no guard): the drafts of a random tiny head are mostly rejected,
// so each pass keeps one or two positions and rolls the rest back; the ids must not change.
TEST(Speculative, GreedyIdsEqualPlainDecode) {
  auto plain = tiny_engine(1, SpeculativeMode::kOff);
  auto spec = tiny_engine(1, SpeculativeMode::kOn);
  ASSERT_TRUE(plain && spec);
  uint64_t passes = 0;
  for (uint32_t salt : {1u, 2u, 3u}) {
    const GenerationResult a = run(*plain, greedy(salt, 48));
    const GenerationResult b = run(*spec, greedy(salt, 48));
    EXPECT_EQ(a.output_ids, b.output_ids) << "prompt " << salt;
    EXPECT_EQ(b.finish_reason, FinishReason::kLength);
    EXPECT_EQ(a.verify_passes, 0);
    EXPECT_GT(b.verify_passes, 0);
    EXPECT_LE(b.drafted_tokens, b.verify_passes * 5);  // whole blocks, shorter only near max_tokens
    EXPECT_GE(b.drafted_tokens, b.verify_passes * 4);
    EXPECT_LE(b.accepted_tokens, b.drafted_tokens);
    passes += b.verify_passes;
  }
  const EngineStats st = spec->stats();
  EXPECT_EQ(st.verify_passes, passes);
  EXPECT_EQ(st.output_tokens, 3u * 48u);
}

// A stop id, EOS, every max_tokens from 1 to 9, and a cancellation: the speculative run ends where the
// plain one does, with the same ids and reason.
TEST(Speculative, EndsWherePlainDecodeEnds) {
  auto plain = tiny_engine(2, SpeculativeMode::kOff);
  auto spec = tiny_engine(2, SpeculativeMode::kOn);
  ASSERT_TRUE(plain && spec);
  const GenerationResult full = run(*plain, greedy(4, 30));
  ASSERT_EQ(full.output_ids.size(), 30u);
  // Stop on the id at output position 11 (its first occurrence): inclusive, reason stop.
  GenerationRequest stop = greedy(4, 30);
  stop.sampling.stop_ids = {full.output_ids[11]};
  const size_t first = std::find(full.output_ids.begin(), full.output_ids.end(), full.output_ids[11]) -
                       full.output_ids.begin();
  const GenerationResult a = run(*plain, stop), b = run(*spec, stop);
  EXPECT_EQ(a.output_ids, b.output_ids);
  EXPECT_EQ(b.output_ids.size(), first + 1);
  EXPECT_EQ(b.finish_reason, FinishReason::kStop);
  for (int max_tokens = 1; max_tokens <= 9; ++max_tokens) {
    const GenerationResult c = run(*spec, greedy(4, max_tokens));
    EXPECT_EQ(c.output_ids, std::vector<int32_t>(full.output_ids.begin(), full.output_ids.begin() + max_tokens));
    EXPECT_EQ(c.finish_reason, FinishReason::kLength);
  }
  // Cancelled by the client after 7 tokens have arrived: the tokens before are the plain ones.
  const GenerationResult d = run(*spec, greedy(4, 30), 7);
  EXPECT_EQ(d.finish_reason, FinishReason::kCancelled);
  ASSERT_GE(d.output_ids.size(), 7u);
  EXPECT_EQ(d.output_ids, std::vector<int32_t>(full.output_ids.begin(), full.output_ids.begin() + d.output_ids.size()));
}

// The context limit is prompt + max_tokens: the verify passes never run past the sequence's capacity.
TEST(Speculative, NeverPassesTheContextLimit) {
  const int prompt = 23, max_tokens = 17;
  auto plain = tiny_engine(3, SpeculativeMode::kOff, false, prompt + max_tokens);
  auto spec = tiny_engine(3, SpeculativeMode::kOn, false, prompt + max_tokens);
  ASSERT_TRUE(plain && spec);
  const GenerationResult a = run(*plain, greedy(5, max_tokens)), b = run(*spec, greedy(5, max_tokens));
  EXPECT_EQ(a.output_ids, b.output_ids);
  EXPECT_EQ(b.finish_reason, FinishReason::kLength);
  EXPECT_GT(b.verify_passes, 0);
}

// Sampling goes through verify passes too (drafts drawn from the draft's distribution, rejection
// sampling against the model's): a seed gives the same ids twice.
TEST(Speculative, SampledRunsAreSeededAndVerified) {
  auto spec = tiny_engine(1, SpeculativeMode::kOn);
  ASSERT_TRUE(spec);
  GenerationRequest r = greedy(6, 24);
  r.sampling.temperature = 0.8f;
  r.sampling.seed = 42;
  const GenerationResult a = run(*spec, r), b = run(*spec, r);
  EXPECT_EQ(a.output_ids, b.output_ids);
  EXPECT_EQ(a.output_ids.size(), 24u);
  EXPECT_GT(a.verify_passes, 0);
}

// --speculative on without stages is an error naming the fix.
TEST(Speculative, OnNeedsDraftStages) {
  model::ModelOptions mo;
  mo.dspark = false;
  auto m = model::Model::load(model::testing::tiny_checkpoint(1), mo);
  ASSERT_TRUE(m.ok());
  EngineOptions o;
  o.prefix_cache = false;
  o.speculative = SpeculativeMode::kOn;
  auto engine = make_engine(std::move(*m), o, "tiny");
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("--speculative auto or off"), std::string::npos);
}

// Speculative rejection sampling: drafts drawn from q, accepted with min(1, p/q), else a draw from
// norm(max(0, p - q)): the tokens it emits are distributed as p. Chi-square over 200000 draws of a
// 6-token vocabulary (5 degrees of freedom; 20.5 is the 0.001 quantile), for a q that is close to p,
// one far from it, and one with no mass where p has some.
TEST(Speculative, RejectionSamplingKeepsTheTargetDistribution) {
  const std::vector<double> p = {0.30, 0.25, 0.20, 0.15, 0.07, 0.03};
  const std::vector<std::vector<double>> qs = {{0.28, 0.27, 0.18, 0.17, 0.06, 0.04},
                                               {0.02, 0.03, 0.05, 0.10, 0.30, 0.50},
                                               {0.0, 0.5, 0.5, 0.0, 0.0, 0.0}};
  for (size_t qi = 0; qi < qs.size(); ++qi) {
    const std::vector<double>& q = qs[qi];
    ops::SampleRng rng(1234 + qi), draft_rng(99 + qi);
    constexpr int kDraws = 200000;
    std::vector<double> count(p.size(), 0.0);
    int accepted = 0;
    for (int i = 0; i < kDraws; ++i) {
      double u = draft_rng.next_uniform_open0(), acc = 0;
      int32_t d = 0;
      for (; d + 1 < static_cast<int32_t>(q.size()); ++d)
        if ((acc += q[d]) >= u) break;
      while (q[d] == 0) --d;  // rounding at the top end: the last token with mass
      const VerifyPick pick = speculative_pick(p, q, d, rng);
      accepted += pick.accepted;
      count[pick.token] += 1;
    }
    double chi2 = 0;
    for (size_t t = 0; t < p.size(); ++t) chi2 += std::pow(count[t] - kDraws * p[t], 2) / (kDraws * p[t]);
    EXPECT_LT(chi2, 20.5) << "q " << qi;
    // The acceptance rate is sum(min(p, q)).
    double overlap = 0;
    for (size_t t = 0; t < p.size(); ++t) overlap += std::min(p[t], q[t]);
    EXPECT_NEAR(static_cast<double>(accepted) / kDraws, overlap, 0.01) << "q " << qi;
  }
}

// The guard: with nothing accepted it backs off exponentially (up to kMaxBackoff steps); accepted
// drafts make passes pay again.
TEST(Speculative, GuardBacksOffWhenDraftsAreRejected) {
  DraftCostModel cost;
  cost.dense_bytes = 1000;
  cost.expert_bytes = 10;
  cost.moe_layers = 4;
  cost.n_experts = 16;
  cost.top_k = 2;
  cost.draft_bytes = 100;
  DraftGuard guard(cost);
  const std::vector<float> conf(5, 0.0f);
  EXPECT_TRUE(guard.should_draft());
  EXPECT_GT(guard.choose(conf, 5), 0);  // the prior drafts
  int drafted_steps = 0;
  for (int step = 0; step < 2000; ++step) {
    if (!guard.should_draft()) continue;
    ++drafted_steps;
    const int k = guard.choose(conf, 5);
    if (k > 0) guard.record(conf, k, 0);
  }
  EXPECT_LT(drafted_steps, 40);  // 2 + 4 + 8 + ... then every kMaxBackoff steps
  EXPECT_LT(guard.acceptance(0.0f), 0.05);
  // Confident drafts that are accepted: a pass pays, and the guard drafts them.
  DraftGuard good(cost);
  const std::vector<float> high(5, 4.0f);
  for (int i = 0; i < 20; ++i) good.record(high, 5, 5);
  EXPECT_GT(good.acceptance(4.0f), 0.9);
  EXPECT_EQ(good.choose(high, 5), 5);
  EXPECT_GT(cost.gain(5, 5.0), 1.0);
  EXPECT_LT(cost.gain(5, 0.0), 1.0);
}

}  // namespace
}  // namespace cedar::runtime

namespace cedar::runtime {
namespace {

// Speculator::step with drafts made right for a chosen number of positions (0..5, cycling) and wrong
// after: every accepted length, the emitted tokens are the plain greedy ones, the sequence keeps
// exactly the inputs of the emitted tokens, and a stop id inside an accepted run cuts it there.
TEST(Speculative, EveryAcceptedLengthEmitsThePlainTokens) {
  auto m = model::testing::load_tiny(2);
  ThreadPool pool(2);
  const size_t vocab = m->sampleable_vocab();
  const auto prompt = model::testing::test_prompt(23, 9);
  const int n = 40;
  std::vector<float> logits(m->config().vocab_size);
  // Plain greedy decode: the truth.
  std::vector<int32_t> truth;
  {
    model::SequenceState seq = m->new_sequence(23 + n + 1);
    model::SeqChunk c{&seq, prompt};
    ASSERT_TRUE(m->forward({&c, 1}, logits.data(), &pool).ok());
    truth.push_back(ops::argmax(logits.data(), vocab));
    while (static_cast<int>(truth.size()) < n) {
      model::SeqChunk one{&seq, {&truth.back(), 1}};
      ASSERT_TRUE(m->forward({&one, 1}, logits.data(), &pool).ok());
      truth.push_back(ops::argmax(logits.data(), vocab));
    }
  }
  for (int stop_at : {-1, 17}) {
    auto spec = Speculator::create(*m, /*guard=*/false);
    ASSERT_TRUE(spec);
    int right = 0;  // drafts made right in this step
    spec->set_draft_filter([&](int64_t position, std::span<int32_t> ids) {
      const int64_t next = position - 23 + 1;  // output index of the first draft
      for (size_t i = 0; i < ids.size(); ++i) {
        const int64_t o = next + static_cast<int64_t>(i);
        const int32_t t = o < n ? truth[o] : 0;
        ids[i] = static_cast<int>(i) < right ? t : (t + 1) % static_cast<int32_t>(vocab);
      }
      right = (right + 1) % 6;
    });
    auto s = spec->new_sequence(0);
    GenerationRequest req;
    req.sampling.temperature = 0;
    req.sampling.max_tokens = n;
    req.sampling.ignore_eos = true;
    if (stop_at >= 0) req.sampling.stop_ids = {truth[stop_at]};
    Sampler sampler(req, vocab, m->config().eos_token_id);
    model::SequenceState seq = m->new_sequence(23 + n + 1);
    model::SeqChunk c{&seq, prompt};
    ASSERT_TRUE(m->forward({&c, 1}, logits.data(), &pool).ok());
    spec->observe(*s, 0, &pool);
    std::vector<int32_t> out = {ops::argmax(logits.data(), vocab)}, tokens;
    size_t longest = 0;
    while (static_cast<int>(out.size()) < n && !sampler.is_stop(out.back())) {
      auto ran = spec->step(*s, seq, out.back(), sampler, 0.0f, n - static_cast<int>(out.size()), &tokens, &pool);
      ASSERT_TRUE(ran.ok()) << ran.status().to_string();
      if (!*ran) {  // one token left: no room for a draft, a plain step
        ASSERT_EQ(static_cast<int>(out.size()), n - 1);
        model::SeqChunk one{&seq, {&out.back(), 1}};
        ASSERT_TRUE(m->forward({&one, 1}, logits.data(), &pool).ok());
        spec->observe(*s, 0, &pool);
        tokens = {ops::argmax(logits.data(), vocab)};
      }
      out.insert(out.end(), tokens.begin(), tokens.end());
      longest = std::max(longest, tokens.size());
      // The state holds the prompt and every emitted token but the last.
      ASSERT_EQ(seq.n_tokens, static_cast<int64_t>(23 + out.size() - 1));
      ASSERT_EQ(s->state.n_positions, seq.n_tokens);
    }
    const size_t end = stop_at < 0 ? n : std::find(truth.begin(), truth.end(), truth[stop_at]) - truth.begin() + 1;
    EXPECT_EQ(out, std::vector<int32_t>(truth.begin(), truth.begin() + end)) << "stop at " << stop_at;
    // Five drafts accepted and the model's own token (the stop at 17 comes before the step that makes
    // all five right: outputs 1 + 1 + 2 + 3 + 4 + 5 before it).
    EXPECT_EQ(longest, stop_at < 0 ? 6u : 5u);
    EXPECT_GT(s->counters.accepted, 0u);
    EXPECT_EQ(std::vector<int32_t>(seq.tokens().begin() + 23, seq.tokens().end()),
              std::vector<int32_t>(out.begin(), out.end() - 1));
  }
}

}  // namespace
}  // namespace cedar::runtime
