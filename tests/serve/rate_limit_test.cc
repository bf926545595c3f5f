// Per-key limits: the token bucket on a fake clock, then --max-tokens-per-minute-per-key over HTTP
// (429 in each API's error shape, Retry-After, x-ratelimit-* headers).
#include <gtest/gtest.h>

#include <chrono>

#include "serve/rate_limit.h"
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

TEST(TokenBudget, GeneratedTokensAreChargedAfterTheTurnAndMayOverdraw) {
  FakeClock clock;
  TokenBudget budget(60, clock.fn());
  ASSERT_TRUE(budget.admit("k", 10).admitted);
  budget.charge("k", 80);  // 50 - 80 = -30
  TokenBudget::Decision d = budget.admit("k", 1);
  EXPECT_FALSE(d.admitted);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after_seconds, 31);
  clock.now += 31s;
  EXPECT_TRUE(budget.admit("k", 1).admitted);
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
  void start(int64_t per_minute) {
    // "Once" is 4 prompt tokens for /v1/completions (a byte-level tokenizer, no template); the
    // reply is 12 bytes + EOS = 13 generated tokens.
    engine_ = test::make_engine({{"", " upon a time" + std::string(test::kEos)}});
    ServerOptions options;
    options.max_tokens_per_minute_per_key = per_minute;
    server_ = std::make_unique<test::TestServer>(*engine_, options);
    client_ = server_->client();
  }
  httplib::Result complete(const std::string& prompt) {
    return client_->Post("/v1/completions", json{{"prompt", prompt}}.dump(), "application/json");
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
  EXPECT_EQ(first->get_header_value("x-ratelimit-remaining-tokens"), "16");  // after the prompt
  // 20 - 4 - 13 = 3 tokens left (plus what refilled meanwhile, 1 every 3 s): a 4-token prompt waits.
  auto second = complete("Once");
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 429) << second->body;
  const int retry = std::stoi(second->get_header_value("Retry-After"));
  EXPECT_GE(retry, 1);
  EXPECT_LE(retry, 3);
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
