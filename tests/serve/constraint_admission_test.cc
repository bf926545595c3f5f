// Where the server compiles a request's output constraint (issue 35, points 2 and 9): after the
// key's token rate limit (a refused request never costs a compilation), and a forced tool call
// whose max_tokens cannot hold one complete call is refused up front instead of cut into partial
// JSON.
#include <gtest/gtest.h>

#include <string>

#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using test::json;

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");

json chat(int max_tokens) {
  return {{"model", "cedar-test"},
          {"max_tokens", max_tokens},
          {"messages", json::array({{{"role", "user"}, {"content", "What is the weather in Paris today, please?"}}})}};
}

TEST(ConstraintAdmission, TheTokenRateLimitComesBeforeTheCompilation) {
  auto engine = test::make_engine({{"", "{}" + std::string(test::kEos)}});
  ServerOptions options;
  options.max_tokens_per_minute_per_key = 5;  // below this prompt: refused whatever the constraint
  test::TestServer server(*engine, options);
  auto client = server.client();
  json body = chat(16);
  // A pattern xgrammar cannot compile: a 400 if it were compiled before the rate limit.
  body["response_format"] = {{"type", "regex"}, {"regex", "("}};
  auto res = client->Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429) << res->body;
}

TEST(ConstraintAdmission, AForcedToolCallThatCannotFitMaxTokensIsRefusedUpFront) {
  auto engine = test::make_engine({{"", "{}" + std::string(test::kEos)}});
  test::TestServer server(*engine);
  auto client = server.client();
  json body = chat(3);
  body["tools"] = kTools;
  body["tool_choice"] = "required";
  auto res = client->Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  const json error = json::parse(res->body)["error"];
  EXPECT_EQ(error["param"], "max_tokens") << res->body;
  const std::string message = error["message"];
  EXPECT_NE(message.find("max_tokens 3 is below the"), std::string::npos) << message;
  EXPECT_NE(message.find("tokens a complete tool call needs"), std::string::npos) << message;
  // The same call named (tool_choice with a function) is forced too.
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  res = client->Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
}

}  // namespace
}  // namespace cedar::serve
