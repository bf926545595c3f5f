// The engine's request streams (runtime::GenerationStream over the ScriptedEngine, which keeps the
// same queue and stream promises as LocalEngine): bounded admission, token hand-off, cancellation,
// shutdown; and the server's ReplayStore.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "runtime/scripted_engine.h"
#include "serve/api/replay_store.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using namespace std::chrono_literals;
using runtime::GenerationStream;
using runtime::ScriptedEngine;
using runtime::ScriptedEngineOptions;

runtime::GenerationRequest request_for(const std::string& prompt, int max_tokens = 100) {
  runtime::GenerationRequest r;
  r.prompt_ids = test::ids_of(prompt);
  r.sampling.max_tokens = max_tokens;
  return r;
}

// Drains a stream to its end; returns every token received.
std::vector<int32_t> drain(GenerationStream& stream) {
  std::vector<int32_t> tokens;
  for (;;) {
    GenerationStream::Update u = stream.next();
    tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.finished) return tokens;
  }
}

// Waits (bounded) until the engine runs `n` sequences.
void wait_running(const runtime::Engine& engine, int n) {
  for (int i = 0; i < 2000 && engine.stats().active_sequences != n; ++i) std::this_thread::sleep_for(2ms);
}

TEST(EngineStream, TokensArriveInOrderAndMatchTheResult) {
  auto engine = test::make_engine({{"", std::string("abc") + test::kEos}});
  auto stream = engine->submit(request_for("hi"));
  ASSERT_TRUE(stream.ok());
  const std::vector<int32_t> tokens = drain(**stream);
  ASSERT_TRUE((*stream)->result().ok());
  EXPECT_EQ(tokens, (*stream)->result()->output_ids);
  EXPECT_EQ(tokens, test::ids_of(std::string("abc") + test::kEos));
  EXPECT_EQ((*stream)->result()->finish_reason, runtime::FinishReason::kStop);
}

// A slow engine with one running place and one queue place, the first taken by `running`.
std::unique_ptr<ScriptedEngine> one_place_left(Result<std::shared_ptr<GenerationStream>>* running) {
  ScriptedEngineOptions slow;
  slow.token_delay = 20ms;
  slow.max_batch = 1;
  slow.max_queue = 1;
  auto engine = test::make_engine({{"", std::string(200, 'x') + test::kEos}}, slow);
  *running = engine->submit(request_for("a"));
  EXPECT_TRUE(running->ok());
  wait_running(*engine, 1);  // the scheduler took it: exactly one place (the queue) is left
  EXPECT_EQ(engine->stats().active_sequences, 1);
  return engine;
}

TEST(EngineStream, RefusesWhenTheBatchAndTheQueueAreFull) {
  Result<std::shared_ptr<GenerationStream>> running = std::shared_ptr<GenerationStream>();
  auto engine = one_place_left(&running);
  ASSERT_TRUE(running.ok());
  auto waiting = engine->submit(request_for("b"));
  ASSERT_TRUE(waiting.ok());
  auto refused = engine->submit(request_for("c"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  (*running)->cancel();
  (*waiting)->cancel();
  drain(**running);
  drain(**waiting);
}

TEST(EngineStream, CancelledWaitingRequestsFreeTheirPlace) {
  Result<std::shared_ptr<GenerationStream>> running = std::shared_ptr<GenerationStream>();
  auto engine = one_place_left(&running);
  ASSERT_TRUE(running.ok());
  auto waiting = engine->submit(request_for("b"));
  ASSERT_TRUE(waiting.ok());
  (*waiting)->cancel();  // its client left
  auto next = engine->submit(request_for("c"));
  ASSERT_TRUE(next.ok()) << next.status().to_string();
  drain(**waiting);
  ASSERT_TRUE((*waiting)->result().ok());
  EXPECT_EQ((*waiting)->result()->finish_reason, runtime::FinishReason::kCancelled);
  EXPECT_TRUE((*waiting)->result()->output_ids.empty());  // never ran
  (*running)->cancel();
  (*next)->cancel();
  drain(**running);
  drain(**next);
}

TEST(EngineStream, CancelStopsARunningGeneration) {
  ScriptedEngineOptions slow;
  slow.token_delay = 5ms;
  auto engine = test::make_engine({{"", std::string(1000, 'x') + test::kEos}}, slow);
  auto stream = engine->submit(request_for("a", 2000));
  ASSERT_TRUE(stream.ok());
  GenerationStream::Update first;
  while (first.tokens.empty()) first = (*stream)->next();
  (*stream)->cancel();
  drain(**stream);
  ASSERT_TRUE((*stream)->result().ok());
  EXPECT_EQ((*stream)->result()->finish_reason, runtime::FinishReason::kCancelled);
  EXPECT_LT((*stream)->result()->output_ids.size(), 1000u);
}

TEST(EngineStream, AWaitEndsAtItsDeadlineWithoutTokens) {
  ScriptedEngineOptions slow;
  slow.prefill_delay_per_token = 200ms;  // the first token is far away
  auto engine = test::make_engine({{"", std::string("x") + test::kEos}}, slow);
  auto stream = engine->submit(request_for("abc"));
  ASSERT_TRUE(stream.ok());
  GenerationStream::Update u = (*stream)->next(std::chrono::steady_clock::now() + 10ms);
  EXPECT_TRUE(u.tokens.empty());
  EXPECT_FALSE(u.finished);
  (*stream)->cancel();
  drain(**stream);
}

TEST(EngineStream, ShutdownEndsEverything) {
  ScriptedEngineOptions slow;
  slow.token_delay = 5ms;
  slow.max_batch = 1;
  auto engine = test::make_engine({{"", std::string(1000, 'x') + test::kEos}}, slow);
  auto a = engine->submit(request_for("a", 2000));
  auto b = engine->submit(request_for("b", 2000));
  ASSERT_TRUE(a.ok() && b.ok());
  engine.reset();
  drain(**a);
  drain(**b);
  for (auto* s : {&*a, &*b}) {
    ASSERT_FALSE((**s).result().ok());
    EXPECT_EQ((**s).result().status().code(), StatusCode::kFailedPrecondition);
  }
}

TEST(EngineStream, BadRequestsAreRefusedAtSubmit) {
  auto engine = test::make_engine({{"", "x"}});
  runtime::GenerationRequest empty;  // an empty prompt
  auto stream = engine->submit(empty);
  ASSERT_FALSE(stream.ok());
  EXPECT_EQ(stream.status().code(), StatusCode::kInvalidArgument);
}

TEST(ReplayStore, FindsByFirstCallIdAndEvictsOldest) {
  ReplayStore store(2);
  store.remember({{{"call_1", "f", "{}"}}, "", "", "raw1"});
  store.remember({{{"call_2", "f", "{}"}}, "", "", "raw2"});
  store.remember({{{"call_3", "f", "{}"}}, "", "", "raw3"});
  EXPECT_FALSE(store.find("call_1").has_value());
  ASSERT_TRUE(store.find("call_3").has_value());
  EXPECT_EQ(store.find("call_3")->raw, "raw3");
  EXPECT_EQ(store.size(), 2u);
  store.remember({{}, "", "", "no calls"});  // nothing to key on: ignored
  EXPECT_EQ(store.size(), 2u);
}

}  // namespace
}  // namespace cedar::serve
