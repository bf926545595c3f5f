// The engine's constrained-decoding hook (runtime::TokenConstraint): the mask is applied before
// sampling, every sampled token is handed to accept_token in order, a rejected token ends the
// request with an error, and a null mask leaves sampling alone.
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/mask_prefetcher.h"

#include "runtime/local_engine.h"
#include "../model/tiny_model_util.h"

namespace cedar::runtime {
namespace {

// Allows the ids of `script` one after another (one id per step), records what it was given.
class ScriptedConstraint final : public TokenConstraint {
 public:
  ScriptedConstraint(std::vector<int32_t> script, int vocab, bool reject_at_end = false)
      : script_(std::move(script)), mask_((vocab + 31) / 32), reject_at_end_(reject_at_end) {}
  const uint32_t* next_token_mask() override {
    if (on_mask) on_mask();
    if (step_ >= script_.size()) return nullptr;
    std::fill(mask_.begin(), mask_.end(), 0u);
    const int32_t id = script_[step_];
    mask_[id / 32] |= 1u << (id % 32);
    return mask_.data();
  }
  bool accept_token(int32_t token) override {
    accepted.push_back(token);
    if (step_ >= script_.size()) return !reject_at_end_;
    return script_[step_++] == token;
  }
  std::vector<int32_t> accepted;
  std::function<void()> on_mask;  // called first in every next_token_mask

 private:
  std::vector<int32_t> script_;
  std::vector<uint32_t> mask_;
  size_t step_ = 0;
  bool reject_at_end_;
};

// A request for the tiny engine's test prompt under `constraint`, sampled at temperature 1.
GenerationRequest constrained_request(std::shared_ptr<TokenConstraint> constraint, uint64_t seed, int max_tokens) {
  GenerationRequest r;
  r.prompt_ids = model::testing::test_prompt(12, 1);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = seed;
  r.sampling.max_tokens = max_tokens;
  r.constraint = std::move(constraint);
  return r;
}

TEST(TokenConstraint, MaskDecidesEveryTokenAndSeesThemAll) {
  auto engine = make_engine(model::testing::tiny_checkpoint(2), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const int vocab = (*engine)->info().vocab_size;
  const std::vector<int32_t> script = {5, 77, 1234, 9, 300};
  auto constraint = std::make_shared<ScriptedConstraint>(script, vocab);
  auto out = (*engine)->generate(constrained_request(constraint, 42, 5));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->output_ids, script) << "a masked sampler can only pick the allowed token";
  EXPECT_EQ(constraint->accepted, script);
  EXPECT_EQ((*engine)->stats().constrained_tokens, script.size());
}

TEST(TokenConstraint, RejectedTokenEndsTheRequestWithAnError) {
  auto engine = make_engine(model::testing::tiny_checkpoint(2), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  auto constraint = std::make_shared<ScriptedConstraint>(std::vector<int32_t>{5}, (*engine)->info().vocab_size,
                                                         /*reject_at_end=*/true);
  GenerationRequest r;
  r.prompt_ids = model::testing::test_prompt(12, 1);
  r.sampling.max_tokens = 8;
  r.constraint = constraint;
  auto out = (*engine)->generate(r);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInternal);
  EXPECT_EQ(constraint->accepted.size(), 2u) << "the second token (unmasked) was refused and generation stopped";
}


// Leaves sampling free (no mask) but, once fewer than `closing` tokens would be left after the
// sampled one, narrows to `closer`: the engine must then sample again from that mask. Records the
// budgets it was asked about.
class ClosingConstraint final : public TokenConstraint {
 public:
  ClosingConstraint(int32_t closer, int closing, int vocab) : closer_(closer), closing_(closing), mask_((vocab + 31) / 32) {
    mask_[closer / 32] |= 1u << (closer % 32);
  }
  const uint32_t* next_token_mask() override { return nullptr; }
  const uint32_t* mask_to_finish_within(int32_t token, int tokens_left_after) override {
    asked.push_back(tokens_left_after);
    return token != closer_ && tokens_left_after < closing_ ? mask_.data() : nullptr;
  }
  bool accept_token(int32_t token) override {
    accepted.push_back(token);
    return true;
  }
  std::vector<int> asked;
  std::vector<int32_t> accepted;

 private:
  int32_t closer_;
  int closing_;
  std::vector<uint32_t> mask_;
};

TEST(TokenConstraint, ANarrowerMaskNearMaxTokensIsSampledAgain) {
  auto engine = make_engine(model::testing::tiny_checkpoint(2), EngineOptions{});
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  constexpr int32_t kCloser = 77;
  auto constraint = std::make_shared<ClosingConstraint>(kCloser, /*closing=*/3, (*engine)->info().vocab_size);
  auto out = (*engine)->generate(constrained_request(constraint, 3, 8));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->output_ids.size(), 8u);
  // Asked with the tokens left after each one: 7, 6, ..., 0.
  EXPECT_EQ(constraint->asked, (std::vector<int>{7, 6, 5, 4, 3, 2, 1, 0}));
  // The last three (left 2, 1, 0 < 3) came from the narrower mask; random weights over 129,280 ids
  // did not pick 77 on their own before.
  for (size_t i = 5; i < 8; ++i) EXPECT_EQ(out->output_ids[i], kCloser) << "token " << i;
  for (size_t i = 0; i < 5; ++i) EXPECT_NE(out->output_ids[i], kCloser) << "token " << i;
  EXPECT_EQ(constraint->accepted, out->output_ids) << "the resampled token is the one accepted";
  EXPECT_EQ((*engine)->stats().constraint_budget_resamples, 3u);
}

// Requests batched together each get their own mask: the masks are computed beside the forward
// pass (runtime/mask_prefetcher.h) and must land on their request's logits row. The first request's
// first mask waits until the other two are queued, so all three share the following steps; the order
// of the mask calls shows that they did.
TEST(TokenConstraint, BatchedRequestsGetTheirOwnMasks) {
  EngineOptions options;
  options.max_batch = 4;
  auto engine = make_engine(model::testing::tiny_checkpoint(2), options);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const int vocab = (*engine)->info().vocab_size;
  const std::vector<std::vector<int32_t>> scripts = {{5, 77, 1234, 9, 300, 41}, {8, 8, 900, 12, 3, 3}, {}};
  std::mutex log_mu;
  std::vector<size_t> mask_calls;  // which request each next_token_mask call was for, in order
  std::vector<std::shared_ptr<ScriptedConstraint>> constraints;
  std::vector<GenerationRequest> requests(scripts.size());
  std::vector<Result<GenerationResult>> results(scripts.size(), internal_error("not run"));
  for (size_t i = 0; i < scripts.size(); ++i) {
    requests[i].prompt_ids = model::testing::test_prompt(12 + static_cast<int>(i), 1);
    requests[i].sampling.temperature = 1.0f;
    requests[i].sampling.seed = 7 + i;
    requests[i].sampling.max_tokens = 6;
    if (!scripts[i].empty()) {  // the last request is unconstrained
      auto c = std::make_shared<ScriptedConstraint>(scripts[i], vocab);
      c->on_mask = [&, i, first = true]() mutable {
        if (i == 0 && first) {
          // On the mask thread, during request 0's first step: wait until the other two are queued
          // (or were admitted with it).
          const auto all_in = [&] {
            const EngineStats st = (*engine)->stats();
            return st.queue_depth + st.active_sequences >= 3;
          };
          while (!all_in()) std::this_thread::yield();
        }
        first = false;
        std::lock_guard<std::mutex> lock(log_mu);
        mask_calls.push_back(i);
      };
      constraints.push_back(c);
      requests[i].constraint = c;
    }
  }
  std::vector<std::thread> threads;
  for (size_t i = 0; i < scripts.size(); ++i)
    threads.emplace_back([&, i] { results[i] = (*engine)->generate(requests[i]); });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < scripts.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status().to_string();
    EXPECT_EQ(results[i]->output_ids.size(), 6u);
    if (!scripts[i].empty()) {
      EXPECT_EQ(results[i]->output_ids, scripts[i]) << "request " << i;
    }
  }
  EXPECT_EQ((*engine)->stats().constrained_tokens, 12u);
  // One batch: after request 0's first step, the calls alternate 0, 1, 0, 1, ... (request 1's
  // masks come between request 0's), where separate runs would give 0 x6 then 1 x6.
  ASSERT_EQ(mask_calls.size(), 12u);
  size_t alternations = 0;
  for (size_t j = 1; j < mask_calls.size(); ++j) alternations += mask_calls[j] != mask_calls[j - 1];
  EXPECT_GE(alternations, 9u) << "the two constrained requests did not share their steps";
}

// Counts the calls and the threads they came from.
class CountingConstraint final : public TokenConstraint {
 public:
  const uint32_t* next_token_mask() override {
    thread = std::this_thread::get_id();
    ++calls;
    return &word;
  }
  bool accept_token(int32_t) override { return true; }
  uint32_t word = 0x5u;
  int calls = 0;
  std::thread::id thread;
};

TEST(MaskPrefetcher, ComputesEachMaskOnceOffTheCallingThread) {
  MaskPrefetcher prefetcher;
  CountingConstraint a, b;
  const std::vector<TokenConstraint*> list = {&a, nullptr, &b};
  for (int step = 1; step <= 3; ++step) {
    prefetcher.start(list);
    EXPECT_GE(prefetcher.wait(), 0.0);
    ASSERT_EQ(prefetcher.masks().size(), 3u);
    EXPECT_EQ(prefetcher.masks()[0], &a.word);
    EXPECT_EQ(prefetcher.masks()[1], nullptr);
    EXPECT_EQ(prefetcher.masks()[2], &b.word);
    EXPECT_EQ(a.calls, step);
    EXPECT_EQ(b.calls, step);
  }
  EXPECT_NE(a.thread, std::this_thread::get_id());
}

// Throws from next_token_mask() on its `fail_at`-th call (1-based); a plain mask otherwise.
class ThrowingConstraint final : public TokenConstraint {
 public:
  explicit ThrowingConstraint(int fail_at) : fail_at_(fail_at) {}
  const uint32_t* next_token_mask() override {
    if (++calls_ == fail_at_) throw std::runtime_error("matcher state broken");
    return nullptr;
  }
  bool accept_token(int32_t) override { return true; }

 private:
  int fail_at_, calls_ = 0;
};

TEST(MaskPrefetcher, AnExceptionFailsOnlyItsOwnConstraint) {
  MaskPrefetcher prefetcher;
  ThrowingConstraint bad(1);
  CountingConstraint good;
  prefetcher.start({&bad, &good});
  prefetcher.wait();
  EXPECT_EQ(prefetcher.error(0), "matcher state broken");
  EXPECT_TRUE(prefetcher.failed(0));
  EXPECT_FALSE(prefetcher.failed(1));
  EXPECT_EQ(prefetcher.error(1), "");
  EXPECT_EQ(prefetcher.masks()[1], &good.word);
  prefetcher.start({&bad, &good});  // the error does not stick to the next step
  prefetcher.wait();
  EXPECT_FALSE(prefetcher.failed(0));
  EXPECT_EQ(prefetcher.error(0), "");
  EXPECT_EQ(good.calls, 2);
}

TEST(TokenConstraint, AThrowingMaskEndsItsRequestWithAnError) {
  auto engine = make_engine(model::testing::tiny_checkpoint(2), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  GenerationRequest r;
  r.prompt_ids = model::testing::test_prompt(12, 1);
  r.sampling.max_tokens = 8;
  r.constraint = std::make_shared<ThrowingConstraint>(3);
  auto out = (*engine)->generate(r);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInternal);
  EXPECT_NE(out.status().to_string().find("matcher state broken"), std::string::npos) << out.status().to_string();
  // The engine goes on serving.
  GenerationRequest plain;
  plain.prompt_ids = model::testing::test_prompt(12, 2);
  plain.sampling.max_tokens = 3;
  auto again = (*engine)->generate(plain);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->output_ids.size(), 3u);
}

}  // namespace
}  // namespace cedar::runtime
