// GenerationQueue / GenerationTask / ReplayStore: bounded admission, token hand-off, cancellation,
// shutdown. The engine is a ScriptedEngine with a known reply and per-token delay.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "serve/task_queue.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using namespace std::chrono_literals;

runtime::GenerationRequest request_for(const std::string& prompt, int max_tokens = 100) {
  runtime::GenerationRequest r;
  r.prompt_ids = test::ids_of(prompt);
  r.sampling.max_tokens = max_tokens;
  return r;
}

// Drains a task to its end; returns every token received.
std::vector<int32_t> drain(GenerationTask& task) {
  std::vector<int32_t> tokens;
  for (;;) {
    GenerationTask::Update u = task.wait_for_update(20ms);
    tokens.insert(tokens.end(), u.tokens.begin(), u.tokens.end());
    if (u.finished) return tokens;
  }
}

TEST(GenerationQueue, TokensArriveInOrderAndMatchTheResult) {
  auto engine = test::make_engine({{"", std::string("abc") + test::kEos}});
  GenerationQueue queue(*engine, {2, 4});
  auto task = queue.submit(request_for("hi"));
  ASSERT_TRUE(task.ok());
  const std::vector<int32_t> tokens = drain(**task);
  ASSERT_TRUE((*task)->result().ok());
  EXPECT_EQ(tokens, (*task)->result()->output_ids);
  EXPECT_EQ(tokens, test::ids_of(std::string("abc") + test::kEos));
  EXPECT_EQ((*task)->result()->finish_reason, runtime::FinishReason::kStop);
}

TEST(GenerationQueue, RefusesWhenWorkersAndWaitingRoomAreFull) {
  ScriptedEngineOptions slow;
  slow.token_delay = 20ms;
  auto engine = test::make_engine({{"", std::string(200, 'x') + test::kEos}}, slow);
  GenerationQueue queue(*engine, {/*workers=*/1, /*max_waiting=*/1});
  auto running = queue.submit(request_for("a"));
  ASSERT_TRUE(running.ok());
  // Wait until the worker took it, so exactly one place (the waiting room) is left.
  for (int i = 0; i < 500 && queue.running() == 0; ++i) std::this_thread::sleep_for(2ms);
  ASSERT_EQ(queue.running(), 1);
  auto waiting = queue.submit(request_for("b"));
  ASSERT_TRUE(waiting.ok());
  auto refused = queue.submit(request_for("c"));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_GE(queue.retry_after_seconds(), 1);
  (*running)->cancel();
  (*waiting)->cancel();
  drain(**running);
  drain(**waiting);
}

TEST(GenerationQueue, CancelledWaitingTasksFreeTheirPlace) {
  ScriptedEngineOptions slow;
  slow.token_delay = 20ms;
  auto engine = test::make_engine({{"", std::string(200, 'x') + test::kEos}}, slow);
  GenerationQueue queue(*engine, {1, 1});
  auto running = queue.submit(request_for("a"));
  for (int i = 0; i < 500 && queue.running() == 0; ++i) std::this_thread::sleep_for(2ms);
  auto waiting = queue.submit(request_for("b"));
  ASSERT_TRUE(waiting.ok());
  (*waiting)->cancel();  // its client left
  auto next = queue.submit(request_for("c"));
  ASSERT_TRUE(next.ok()) << next.status().to_string();
  drain(**waiting);
  EXPECT_EQ((*waiting)->result()->finish_reason, runtime::FinishReason::kCancelled);
  EXPECT_TRUE((*waiting)->result()->output_ids.empty());  // never reached the engine
  (*running)->cancel();
  (*next)->cancel();
  drain(**running);
  drain(**next);
}

TEST(GenerationQueue, CancelStopsARunningGeneration) {
  ScriptedEngineOptions slow;
  slow.token_delay = 5ms;
  auto engine = test::make_engine({{"", std::string(1000, 'x') + test::kEos}}, slow);
  GenerationQueue queue(*engine, {1, 0});
  auto task = queue.submit(request_for("a", 2000));
  ASSERT_TRUE(task.ok());
  GenerationTask::Update first;
  while (first.tokens.empty()) first = (*task)->wait_for_update(50ms);
  (*task)->cancel();
  drain(**task);
  ASSERT_TRUE((*task)->result().ok());
  EXPECT_EQ((*task)->result()->finish_reason, runtime::FinishReason::kCancelled);
  EXPECT_LT((*task)->result()->output_ids.size(), 1000u);
}

TEST(GenerationQueue, ShutdownEndsEverything) {
  ScriptedEngineOptions slow;
  slow.token_delay = 5ms;
  auto engine = test::make_engine({{"", std::string(1000, 'x') + test::kEos}}, slow);
  GenerationQueue queue(*engine, {1, 4});
  auto a = queue.submit(request_for("a", 2000));
  auto b = queue.submit(request_for("b", 2000));
  ASSERT_TRUE(a.ok() && b.ok());
  queue.shutdown();
  drain(**a);
  drain(**b);
  EXPECT_EQ((*b)->result()->finish_reason, runtime::FinishReason::kCancelled);
  auto late = queue.submit(request_for("c"));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition);
}

TEST(GenerationQueue, EngineErrorsReachTheTask) {
  auto engine = test::make_engine({{"", "x"}});
  GenerationQueue queue(*engine, {1, 1});
  runtime::GenerationRequest empty;  // an empty prompt: the engine refuses it
  auto task = queue.submit(empty);
  ASSERT_TRUE(task.ok());
  drain(**task);
  ASSERT_FALSE((*task)->result().ok());
  EXPECT_EQ((*task)->result().status().code(), StatusCode::kInvalidArgument);
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
