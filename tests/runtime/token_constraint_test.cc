// The engine's constrained-decoding hook (runtime::TokenConstraint): the mask is applied before
// sampling, every sampled token is handed to accept_token in order, a rejected token ends the
// request with an error, and a null mask leaves sampling alone.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <new>
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
  auto out = runtime::generate(**engine, constrained_request(constraint, 42, 5));
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
  auto out = runtime::generate(**engine, r);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInternal);
  EXPECT_EQ(constraint->accepted.size(), 2u) << "the second token (unmasked) was refused and generation stopped";
}


// Allows `allowed` tokens one by one, then none: a grammar that reaches a dead end (a pattern such
// as `a[^\s\S]`). The request must end with the client's error (InvalidArgument, a 400 in the
// server) after exactly those tokens, not with the engine sampling a forbidden token.
class DeadEndConstraint final : public TokenConstraint {
 public:
  DeadEndConstraint(int allowed, int vocab) : allowed_(allowed), mask_((vocab + 31) / 32) {}
  const uint32_t* next_token_mask() override {
    std::fill(mask_.begin(), mask_.end(), 0u);
    if (accepted < allowed_) mask_[0] = 1u << 7;  // token 7 only
    return mask_.data();
  }
  bool accept_token(int32_t token) override {
    ++accepted;
    return token == 7 && accepted <= allowed_;
  }
  int accepted = 0;

 private:
  int allowed_;
  std::vector<uint32_t> mask_;
};

TEST(TokenConstraint, AMaskThatAllowsNothingEndsTheRequestAsTheClientsError) {
  auto engine = make_engine(model::testing::tiny_checkpoint(2), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  for (int allowed : {0, 2}) {
    auto constraint = std::make_shared<DeadEndConstraint>(allowed, (*engine)->info().vocab_size);
    auto out = runtime::generate(**engine, constrained_request(constraint, 3, 8));
    ASSERT_FALSE(out.ok()) << "a dead end cannot produce output";
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << out.status().to_string();
    EXPECT_NE(out.status().message().find("after " + std::to_string(allowed) + " output tokens"), std::string::npos)
        << out.status().message();
    EXPECT_EQ(constraint->accepted, allowed) << "no token was sampled past the dead end";
  }
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
  auto out = runtime::generate(**engine, constrained_request(constraint, 3, 8));
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
  // Request 0's first mask waits for the others to arrive: not a costly mask to park (that is
  // ACostlyMaskDoesNotStallTheBatch), so the budget is out of the way.
  options.mask_budget_seconds = 3600;
  // No prefix cache: requests start in the step that admits them (with a cache, the store thread
  // restores each first, and one may join a step later), so both constrained ones share every step.
  options.prefix_cache = false;
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
    threads.emplace_back([&, i] { results[i] = runtime::generate(**engine, requests[i]); });
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

// A slot over `c`, which the test keeps alive itself (the aliasing shared_ptr owns nothing).
std::shared_ptr<MaskSlot> slot_of(TokenConstraint* c) {
  return std::make_shared<MaskSlot>(std::shared_ptr<TokenConstraint>(std::shared_ptr<void>(), c));
}

TEST(MaskPrefetcher, ComputesEachMaskOnceOffTheCallingThread) {
  MaskPrefetcher prefetcher(/*budget_seconds=*/3600);
  CountingConstraint a, b;
  auto sa = slot_of(&a), sb = slot_of(&b);
  for (int step = 1; step <= 3; ++step) {
    prefetcher.submit(sa);
    prefetcher.submit(sb);
    EXPECT_GE(prefetcher.wait({sa.get(), sb.get()}), 0.0);
    ASSERT_TRUE(prefetcher.ready(*sa));
    ASSERT_TRUE(prefetcher.ready(*sb));
    EXPECT_EQ(sa->mask, &a.word);
    EXPECT_EQ(sb->mask, &b.word);
    EXPECT_EQ(a.calls, step);
    EXPECT_EQ(b.calls, step);
  }
  EXPECT_NE(a.thread, std::this_thread::get_id());
  EXPECT_FALSE(sa->slow);
}

// Throws from next_token_mask() on its `fail_at`-th call (1-based); a plain mask otherwise.
class ThrowingConstraint final : public TokenConstraint {
 public:
  explicit ThrowingConstraint(int fail_at, bool bad_alloc = false) : fail_at_(fail_at), bad_alloc_(bad_alloc) {}
  const uint32_t* next_token_mask() override {
    if (++calls_ == fail_at_) {
      if (bad_alloc_) throw std::bad_alloc();
      throw std::runtime_error("matcher state broken");
    }
    return nullptr;
  }
  bool accept_token(int32_t) override { return true; }

 private:
  int fail_at_, calls_ = 0;
  bool bad_alloc_;
};

TEST(MaskPrefetcher, AnExceptionFailsOnlyItsOwnConstraint) {
  MaskPrefetcher prefetcher(/*budget_seconds=*/3600);
  ThrowingConstraint bad(1);
  CountingConstraint good;
  auto sbad = slot_of(&bad), sgood = slot_of(&good);
  prefetcher.submit(sbad);
  prefetcher.submit(sgood);
  prefetcher.wait({sbad.get(), sgood.get()});
  EXPECT_EQ(MaskPrefetcher::error_message(*sbad), "matcher state broken");
  EXPECT_EQ(MaskPrefetcher::error_message(*sgood), "");
  EXPECT_EQ(sgood->mask, &good.word);
  prefetcher.submit(sbad);  // the error does not stick to the next step
  prefetcher.submit(sgood);
  prefetcher.wait({sbad.get(), sgood.get()});
  EXPECT_EQ(MaskPrefetcher::error_message(*sbad), "");
  EXPECT_EQ(good.calls, 2);
}

TEST(MaskPrefetcher, AnAllocationFailureFailsOnlyItsOwnConstraint) {
  MaskPrefetcher prefetcher(/*budget_seconds=*/3600);
  ThrowingConstraint oom(1, /*bad_alloc=*/true);
  auto slot = slot_of(&oom);
  prefetcher.submit(slot);
  prefetcher.wait_for(*slot);
  EXPECT_EQ(MaskPrefetcher::error_message(*slot), "out of memory computing the token mask");
}

// A mask that blocks until the test opens it (a constraint whose mask costs without bound), then
// allows every token; counts its calls.
class LatchedConstraint final : public TokenConstraint {
 public:
  const uint32_t* next_token_mask() override {
    std::unique_lock<std::mutex> lock(mu_);
    ++calls_;
    entered_.notify_all();
    opened_.wait(lock, [&] { return open_; });
    return nullptr;
  }
  bool accept_token(int32_t) override { return true; }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    opened_.notify_all();
  }
  void wait_entered() {
    std::unique_lock<std::mutex> lock(mu_);
    entered_.wait(lock, [&] { return calls_ > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable entered_, opened_;
  int calls_ = 0;
  bool open_ = false;
};

TEST(MaskPrefetcher, AMaskOverTheBudgetIsNotWaitedForAndDoesNotHoldUpTheMasksBehindIt) {
  MaskPrefetcher prefetcher(/*budget_seconds=*/0.001);
  LatchedConstraint costly;
  CountingConstraint cheap;
  auto scostly = slot_of(&costly), scheap = slot_of(&cheap);
  prefetcher.submit(scostly);  // first on the shared lane: the cheap mask is queued behind it
  prefetcher.submit(scheap);
  costly.wait_entered();
  prefetcher.wait({scostly.get(), scheap.get()});  // gives up after the budget
  EXPECT_FALSE(prefetcher.ready(*scostly));
  EXPECT_TRUE(scostly->slow) << "a mask over the budget moves to the slow lane";
  EXPECT_EQ(prefetcher.retired_lanes(), 1);
  // The cheap mask is computed by the shared lane's new thread while the costly one still blocks.
  prefetcher.wait_for(*scheap);
  EXPECT_EQ(scheap->mask, &cheap.word);
  for (int step = 0; step < 3; ++step) {
    prefetcher.submit(scheap);
    prefetcher.wait({scostly.get(), scheap.get()});  // a slow slot is not waited for
    prefetcher.wait_for(*scheap);
  }
  EXPECT_EQ(cheap.calls, 4);
  EXPECT_FALSE(prefetcher.ready(*scostly));
  costly.open();
  prefetcher.wait_for(*scostly);
  EXPECT_EQ(MaskPrefetcher::error_message(*scostly), "");
}

// Issue 35, point 5: a plain request batched with a constraint whose mask blocks (a costly grammar
// taken to the limit) runs all its 32 tokens while that mask has not come back, and so does a
// cheaply constrained one; the costly request then finishes too, with its tokens in order.
TEST(TokenConstraint, ACostlyMaskDoesNotStallTheBatch) {
  EngineOptions options;
  options.max_batch = 4;
  auto engine = make_engine(model::testing::tiny_checkpoint(2), options);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  const int vocab = (*engine)->info().vocab_size;
  auto costly = std::make_shared<LatchedConstraint>();
  Result<GenerationResult> costly_out = internal_error("not run"), plain_out = internal_error("not run"),
                           cheap_out = internal_error("not run");
  std::thread costly_thread([&] { costly_out = runtime::generate(**engine, constrained_request(costly, 1, 8)); });
  costly->wait_entered();  // the costly request is in the batch, its first mask blocking
  // Bounds the test should the batch stall after all: the mask is opened after a long while, and
  // the test fails on that, not on a time it measured.
  std::mutex watch_mu;
  std::condition_variable watch_cv;
  bool finished = false, watchdog_opened = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(watch_mu);
    if (!watch_cv.wait_for(lock, std::chrono::minutes(2), [&] { return finished; })) {
      watchdog_opened = true;
      costly->open();
    }
  });
  const std::vector<int32_t> script = {5, 77, 1234, 9, 300, 41, 8, 8};
  auto cheap = std::make_shared<ScriptedConstraint>(script, vocab);
  std::thread cheap_thread([&] { cheap_out = runtime::generate(**engine, constrained_request(cheap, 2, 8)); });
  GenerationRequest plain;
  plain.prompt_ids = model::testing::test_prompt(12, 3);
  plain.sampling.max_tokens = 32;
  plain_out = runtime::generate(**engine, plain);
  cheap_thread.join();
  {
    std::lock_guard<std::mutex> lock(watch_mu);
    finished = true;
  }
  watch_cv.notify_all();
  watchdog.join();
  // Both ended while the costly mask still blocked: the batch did not wait for it.
  EXPECT_FALSE(watchdog_opened) << "the batch waited for the costly mask";
  ASSERT_TRUE(plain_out.ok()) << plain_out.status().to_string();
  EXPECT_EQ(plain_out->output_ids.size(), 32u);
  ASSERT_TRUE(cheap_out.ok()) << cheap_out.status().to_string();
  EXPECT_EQ(cheap_out->output_ids, script);
  EXPECT_GE((*engine)->stats().constraint_parked_steps, 1u);
  costly->open();
  costly_thread.join();
  ASSERT_TRUE(costly_out.ok()) << costly_out.status().to_string();
  EXPECT_EQ(costly_out->output_ids.size(), 8u);
}

TEST(TokenConstraint, AThrowingMaskEndsItsRequestWithAnError) {
  auto engine = make_engine(model::testing::tiny_checkpoint(2), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  GenerationRequest r;
  r.prompt_ids = model::testing::test_prompt(12, 1);
  r.sampling.max_tokens = 8;
  r.constraint = std::make_shared<ThrowingConstraint>(3);
  auto out = runtime::generate(**engine, r);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInternal);
  EXPECT_NE(out.status().to_string().find("matcher state broken"), std::string::npos) << out.status().to_string();
  // The engine goes on serving.
  GenerationRequest plain;
  plain.prompt_ids = model::testing::test_prompt(12, 2);
  plain.sampling.max_tokens = 3;
  auto again = runtime::generate(**engine, plain);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->output_ids.size(), 3u);
}

}  // namespace
}  // namespace cedar::runtime

namespace cedar::runtime {
namespace {

// Every token allowed; accept_token runs out of memory on the third token.
class OutOfMemoryOnAccept final : public TokenConstraint {
 public:
  const uint32_t* next_token_mask() override { return nullptr; }
  bool accept_token(int32_t) override {
    if (++calls_ == 3) throw std::bad_alloc();
    return true;
  }

 private:
  int calls_ = 0;
};

TEST(TokenConstraint, AnAllocationFailureInAcceptEndsOnlyItsRequest) {
  auto engine = make_engine(model::testing::tiny_checkpoint(2), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  GenerationRequest r;
  r.prompt_ids = model::testing::test_prompt(12, 1);
  r.sampling.max_tokens = 8;
  r.constraint = std::make_shared<OutOfMemoryOnAccept>();
  auto out = runtime::generate(**engine, r);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInternal);
  GenerationRequest plain;
  plain.prompt_ids = model::testing::test_prompt(12, 2);
  plain.sampling.max_tokens = 3;
  auto again = runtime::generate(**engine, plain);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->output_ids.size(), 3u);
}

}  // namespace
}  // namespace cedar::runtime
