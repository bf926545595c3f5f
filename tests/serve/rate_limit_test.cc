// Per-key limits: the token bucket on a fake clock, then --max-tokens-per-minute-per-key over HTTP
// (429 in each API's error shape, Retry-After, x-ratelimit-* headers).
#include <gtest/gtest.h>

#include <chrono>

#include "serve/http/rate_limit.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using test::json;
using namespace std::chrono_literals;

struct FakeClock {
  std::chrono::steady_clock::time_point now{};
  TokenBudget::Clock fn() {
    return [this] { return now; };
  }
};

TEST(TokenBudget, AdmitsPromptsWhileTheBucketHoldsThemAndRefillsPerSecond) {
  FakeClock clock;
  TokenBudget budget(60, clock.fn());  // one token per second
  TokenBudget::Decision d = budget.admit("k", 50);
  EXPECT_TRUE(d.admitted);
  EXPECT_EQ(d.remaining, 10);
  EXPECT_EQ(d.limit, 60);
  EXPECT_DOUBLE_EQ(d.reset_seconds, 50.0);
  d = budget.admit("k", 20);
  EXPECT_FALSE(d.admitted);
  EXPECT_FALSE(d.never);
  EXPECT_EQ(d.retry_after_seconds, 10);  // 10 tokens missing at 1 token/s
  EXPECT_TRUE(budget.admit("other", 20).admitted) << "each key has its own bucket";
  clock.now += 10s;
  EXPECT_TRUE(budget.admit("k", 20).admitted);
  clock.now += 1h;
  EXPECT_EQ(budget.admit("k", 0).remaining, 60) << "the bucket never holds more than a minute's tokens";
}

TEST(TokenBudget, TheOutputBudgetIsTakenUpFrontAndItsUnusedPartGivenBack) {
  FakeClock clock;
  TokenBudget budget(60, clock.fn());
  TokenBudget::Decision d = budget.admit("k", 10, 30);
  ASSERT_TRUE(d.admitted);
  EXPECT_EQ(d.remaining, 20);  // 60 - 10 - 30
  budget.refund("k", 25);      // the turn generated 5 of its 30
  EXPECT_EQ(budget.admit("k", 0).remaining, 45);
  d = budget.admit("k", 10, 40);  // 50 > 45
  EXPECT_FALSE(d.admitted);
  EXPECT_FALSE(d.never);
  EXPECT_EQ(d.retry_after_seconds, 5);
  budget.refund("k", 1000);
  EXPECT_EQ(budget.admit("k", 0).remaining, 60) << "a refund never fills the bucket past its limit";
  d = budget.admit("k", 10, 51);
  EXPECT_FALSE(d.admitted);
  EXPECT_TRUE(d.never) << "prompt + output budget over the whole limit";
}

// Issue 35: charged only at the end, a burst of requests admitted together used 5x the budget. With the
// output budget taken at admission, what a burst can spend within the minute is at most the limit.
TEST(TokenBudget, ABurstCannotSpendMoreThanTheBudget) {
  FakeClock clock;
  constexpr int64_t kLimit = 1000, kPrompt = 20, kMaxTokens = 180;
  TokenBudget budget(kLimit, clock.fn());
  int64_t spent = 0;
  int admitted = 0;
  for (int i = 0; i < 50; ++i) {  // 50 requests at the same instant, each generating all it may
    if (!budget.admit("k", kPrompt, kMaxTokens).admitted) continue;
    ++admitted;
    spent += kPrompt + kMaxTokens;
    budget.refund("k", 0);
  }
  EXPECT_EQ(admitted, 5);
  EXPECT_LE(spent, kLimit);
  // Over a longer run at one request a second, the spend per minute stays within limit + one burst.
  spent = 0;
  for (int second = 0; second < 600; ++second) {
    clock.now += 1s;
    if (budget.admit("k", kPrompt, kMaxTokens).admitted) spent += kPrompt + kMaxTokens;
  }
  EXPECT_LE(spent, kLimit * 10 + kLimit) << "10 minutes";
  EXPECT_GE(spent, kLimit * 9) << "the budget is still usable";
}

TEST(TokenBudget, APromptOverTheWholeBudgetIsNeverAdmitted) {
  FakeClock clock;
  TokenBudget budget(60, clock.fn());
  TokenBudget::Decision d = budget.admit("k", 61);
  EXPECT_FALSE(d.admitted);
  EXPECT_TRUE(d.never);
  EXPECT_EQ(budget.admit("k", 60).remaining, 0) << "a refused prompt takes nothing";
}

TEST(TokenBudget, ZeroMeansNoLimit) {
  TokenBudget budget(0);
  EXPECT_FALSE(budget.enabled());
  EXPECT_TRUE(budget.admit("k", 1 << 30).admitted);
}

TEST(KeySlots, CountsRequestsInFlightPerKey) {
  KeySlots slots(1);
  EXPECT_TRUE(slots.acquire("a"));
  EXPECT_FALSE(slots.acquire("a"));
  EXPECT_TRUE(slots.acquire("b"));
  slots.release("a");
  EXPECT_TRUE(slots.acquire("a"));
}

class TokenLimitTest : public ::testing::Test {
 protected:
  void start(int64_t per_minute, int max_tokens = 13) {
    // "Once" is 4 prompt tokens for /v1/completions (a byte-level tokenizer, no template); the
    // reply is 12 bytes + EOS = 13 generated tokens.
    engine_ = test::make_engine({{"", " upon a time" + std::string(test::kEos)}});
    ServerOptions options;
    options.max_tokens_per_minute_per_key = per_minute;
    options.service.default_max_tokens = max_tokens;  // the output budget a request without max_tokens takes
    server_ = std::make_unique<test::TestServer>(*engine_, options);
    client_ = server_->client();
  }
  httplib::Result complete(const std::string& prompt, json extra = json::object()) {
    json body = {{"prompt", prompt}};
    body.update(extra);
    return client_->Post("/v1/completions", body.dump(), "application/json");
  }
  std::unique_ptr<ScriptedEngine> engine_;
  std::unique_ptr<test::TestServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(TokenLimitTest, SpentTokensAnswer429WithRetryAfterInEachApisShape) {
  start(20);
  auto first = complete("Once");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 200) << first->body;
  EXPECT_EQ(first->get_header_value("x-ratelimit-limit-tokens"), "20");
  // 20 - 4 prompt tokens - 13 (the output budget, all of it generated) = 3 left (plus what refilled
  // meanwhile, 1 every 3 s): the next request, 17 tokens, waits ~42 s.
  EXPECT_EQ(first->get_header_value("x-ratelimit-remaining-tokens"), "3");
  auto second = complete("Once");
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 429) << second->body;
  const int retry = std::stoi(second->get_header_value("Retry-After"));
  EXPECT_GE(retry, 36);
  EXPECT_LE(retry, 42);
  EXPECT_EQ(second->get_header_value("x-ratelimit-limit-tokens"), "20");
  EXPECT_EQ(second->get_header_value("x-ratelimit-remaining-tokens"), "3");
  const json body = json::parse(second->body);
  EXPECT_EQ(body["error"]["code"], "rate_limit_exceeded");
  EXPECT_EQ(body["error"]["type"], "tokens");
  EXPECT_NE(body["error"]["message"].get<std::string>().find("--max-tokens-per-minute-per-key"), std::string::npos);

  auto anthropic = client_->Post(
      "/v1/messages", json{{"max_tokens", 10}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump(),
      "application/json");
  ASSERT_TRUE(anthropic);
  ASSERT_EQ(anthropic->status, 429) << anthropic->body;
  const json a = json::parse(anthropic->body);
  EXPECT_EQ(a["type"], "error");
  EXPECT_EQ(a["error"]["type"], "rate_limit_error");
  EXPECT_FALSE(anthropic->get_header_value("Retry-After").empty());
}

TEST_F(TokenLimitTest, TheUnusedOutputBudgetIsGivenBackAfterTheTurn) {
  start(60, /*max_tokens=*/40);
  auto first = complete("Once", {{"max_tokens", 40}});
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  EXPECT_EQ(first->get_header_value("x-ratelimit-remaining-tokens"), "16");  // 60 - 4 - 40
  // It generated 13 of its 40: 27 came back, so 43 (+ refill) hold the next 4 + 35.
  auto second = complete("Once", {{"max_tokens", 35}});
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 200) << second->body;
  const int remaining = std::stoi(second->get_header_value("x-ratelimit-remaining-tokens"));
  EXPECT_GE(remaining, 4);
  EXPECT_LE(remaining, 8);
  // 22 more came back (~26 now); max_tokens 1000 is clamped to the server's 40, and 44 do not fit.
  auto third = complete("Once", {{"max_tokens", 1000}});
  ASSERT_TRUE(third);
  ASSERT_EQ(third->status, 429) << third->body;
  EXPECT_NE(third->body.find("4 prompt tokens + 40 output tokens"), std::string::npos) << third->body;
}

TEST_F(TokenLimitTest, APromptOverTheWholeBudgetSaysSoWithoutRetryAfter) {
  start(3);
  auto r = complete("Once");  // 4 tokens > 3 per minute
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 429) << r->body;
  EXPECT_FALSE(r->has_header("Retry-After"));
  EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find("shorten the prompt"), std::string::npos);
}

}  // namespace
}  // namespace cedar::serve
