// End to end over loopback HTTP: every endpoint, streaming and not, the two-turn tool call with
// exact replay (checked through the emulated prefix cache), authentication, limits and errors.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using test::json;
using test::post_json;
using namespace std::chrono_literals;

const std::string kToolCall =
    "Checking.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
    "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n"
    "</｜DSML｜ invoke>\n</｜DSML｜ calls>" + std::string(test::kEos);
const std::string kAnswer = "Rain in Paris." + std::string(test::kEos);

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "description": "Weather of a city", "parameters": {"type": "object",
  "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}])");

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

// POSTs a streaming request and returns the event-stream body.
std::string post_stream(httplib::Client& client, const std::string& path, const json& body, int* status = nullptr) {
  auto res = client.Post(path, body.dump(), "application/json");
  if (!res) {
    ADD_FAILURE() << "no response: " << httplib::to_string(res.error());
    return {};
  }
  if (status) *status = res->status;
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  return res->body;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void start(std::vector<std::pair<std::string, std::string>> replies, ServerOptions options = {},
             ScriptedEngineOptions engine_options = {}, int max_context = 65536) {
    engine_ = test::make_engine(replies, engine_options, max_context);
    server_ = std::make_unique<test::TestServer>(*engine_, options);
    client_ = server_->client();
  }
  std::unique_ptr<ScriptedEngine> engine_;
  std::unique_ptr<test::TestServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HttpServerTest, HealthModelsAndMetrics) {
  start({{"", kAnswer}});
  auto health = client_->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "cedar-test");
  post_json(*client_, "/v1/chat/completions", {{"messages", {user("hi")}}});
  auto metrics = client_->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  for (const char* needle : {"cedar_http_responses_total{endpoint=\"chat_completions\",code=\"200\"} 1",
                             "cedar_engine_requests_total 1", "cedar_queue_depth 0",
                             "cedar_prefix_cache_lookups_total{result=\"miss\"} 1", "cedar_kv_bytes{tier=\"memory\"}",
                             "cedar_decode_tokens_per_second", "cedar_prefill_tokens_per_second"})
    EXPECT_NE(metrics->body.find(needle), std::string::npos) << needle << "\n" << metrics->body;
}

TEST_F(HttpServerTest, ModelById) {
  start({{"", kAnswer}});
  auto found = client_->Get("/v1/models/cedar-test");
  ASSERT_TRUE(found);
  EXPECT_EQ(found->status, 200);
  EXPECT_EQ(json::parse(found->body)["id"], "cedar-test");
  EXPECT_EQ(json::parse(found->body)["object"], "model");
  // OpenAI's answer for an unknown model: 404, invalid_request_error, code model_not_found.
  auto missing = client_->Get("/v1/models/gpt-4o");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  const json err = json::parse(missing->body)["error"];
  EXPECT_EQ(err["type"], "invalid_request_error");
  EXPECT_EQ(err["code"], "model_not_found");
  EXPECT_EQ(err["param"], "model");
}

TEST_F(HttpServerTest, ChatCompletionNonStreaming) {
  start({{"", kAnswer}});
  int status = 0;
  const json r = post_json(*client_, "/v1/chat/completions", {{"model", "any"}, {"messages", {user("hi")}}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(r["model"], "any");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Rain in Paris.");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  // Prompt: BOS <User> h i <Assistant> </think> = 6 tokens; output: 14 bytes + EOS.
  EXPECT_EQ(r["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(r["usage"]["completion_tokens"], 15);
}

TEST_F(HttpServerTest, ChatCompletionStreamingNeverLeaksMarkup) {
  start({{"", kToolCall}});
  const std::string body = post_stream(
      *client_, "/v1/chat/completions",
      {{"messages", {user("weather?")}}, {"tools", kTools}, {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  EXPECT_EQ(body.find("DSML"), std::string::npos) << body;
  const auto events = test::parse_sse(body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back().data, "[DONE]");
  std::string content;
  json tool_call;
  std::string finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json chunk = json::parse(events[i].data);
    if (chunk["choices"].empty()) {
      EXPECT_EQ(chunk["usage"]["completion_tokens"], static_cast<int>(test::ids_of(kToolCall).size()));
      continue;
    }
    const json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (delta.contains("tool_calls")) tool_call = delta["tool_calls"][0];
    if (!chunk["choices"][0]["finish_reason"].is_null()) finish = chunk["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(content, "Checking.");
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_EQ(tool_call["function"]["name"], "get_weather");
  EXPECT_EQ(tool_call["function"]["arguments"], "{\"city\": \"Paris\", \"days\": 3}");
}

// Turn 2 of a tool conversation must start with exactly the tokens turn 1 saw and generated: the
// emulated prefix cache then reports all of them as cached.
TEST_F(HttpServerTest, TwoTurnToolCallReplaysExactly) {
  start({{"<tool_result>", kAnswer}, {"", kToolCall}});
  const json first_messages = {{{"role", "system"}, {"content", "You help."}}, user("Weather in Paris?")};
  const json r1 = post_json(*client_, "/v1/chat/completions", {{"messages", first_messages}, {"tools", kTools}});
  ASSERT_EQ(r1["choices"][0]["finish_reason"], "tool_calls");
  const json& message = r1["choices"][0]["message"];
  const std::string call_id = message["tool_calls"][0]["id"];

  json second_messages = first_messages;
  second_messages.push_back(message);  // as the SDK hands it back (content, tool_calls)
  second_messages.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", "rain"}});
  const json r2 = post_json(*client_, "/v1/chat/completions", {{"messages", second_messages}, {"tools", kTools}});
  EXPECT_EQ(r2["choices"][0]["message"]["content"], "Rain in Paris.");
  const int turn1 = r1["usage"]["prompt_tokens"].get<int>() + r1["usage"]["completion_tokens"].get<int>();
  EXPECT_EQ(r2["usage"]["prompt_tokens_details"]["cached_tokens"], turn1);
  EXPECT_GT(r2["usage"]["prompt_tokens"].get<int>(), turn1);
}

// A parameter the model wrote in compact JSON re-renders differently from the arguments the client
// returns (the encoder prints {"a": 1}); the replay store restores the exact bytes. Thinking mode,
// and the client drops reasoning_content (most Chat Completions clients do): restored too.
TEST_F(HttpServerTest, ReplayRestoresNonCanonicalCallsAndDroppedReasoning) {
  const std::string odd_call =
      "plan it</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"search\">\n"
      "<｜DSML｜ parameter name=\"filters\" string=\"false\">{\"lang\":[\"en\"]}</｜DSML｜ parameter>\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>" + std::string(test::kEos);
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "search", "parameters": {}}}])");
  auto run = [&](bool keep_store) {
    start({{"<tool_result>", "done</think>ok" + std::string(test::kEos)}, {"", odd_call}});
    const json first = {{{"role", "system"}, {"content", "s"}}, user("find")};
    const json request = {{"messages", first}, {"tools", tools}, {"reasoning_effort", "medium"}};
    const json r1 = post_json(*client_, "/v1/chat/completions", request);
    json assistant = r1["choices"][0]["message"];
    EXPECT_EQ(assistant["reasoning_content"], "plan it");
    EXPECT_EQ(assistant["tool_calls"][0]["function"]["arguments"], "{\"filters\": {\"lang\":[\"en\"]}}");
    assistant.erase("reasoning_content");
    if (!keep_store) {  // the same engine (and prefix cache) behind a fresh server
      server_ = std::make_unique<test::TestServer>(*engine_);
      client_ = server_->client();
    }
    json messages = first;
    messages.push_back(assistant);
    messages.push_back({{"role", "tool"}, {"tool_call_id", assistant["tool_calls"][0]["id"]}, {"content", "[]"}});
    json second = request;
    second["messages"] = messages;
    const json r2 = post_json(*client_, "/v1/chat/completions", second);
    EXPECT_EQ(r2["choices"][0]["message"]["content"], "ok");
    return std::pair<int, int>(r2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
                               r1["usage"]["prompt_tokens"].get<int>() + r1["usage"]["completion_tokens"].get<int>());
  };
  const auto [cached, turn1] = run(/*keep_store=*/true);
  EXPECT_EQ(cached, turn1);
  // The same conversation through a server that never saw turn 1 (a fresh replay store): the
  // re-rendered turn differs from what was generated, so the cache stops at the reasoning.
  const auto [cold_cached, cold_turn1] = run(/*keep_store=*/false);
  EXPECT_LT(cold_cached, cold_turn1);
}

TEST_F(HttpServerTest, ResponsesApiRoundTrip) {
  start({{"<tool_result>", "ok</think>Sunny." + std::string(test::kEos)}, {"", "look</think>" + kToolCall}});
  const json tools = json::parse(R"([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}])");
  const json r1 = post_json(*client_, "/v1/responses",
                            {{"input", "Weather?"}, {"tools", tools}, {"reasoning", {{"effort", "high"}}}});
  EXPECT_EQ(r1["object"], "response");
  ASSERT_EQ(r1["output"].size(), 3u);
  EXPECT_EQ(r1["output"][0]["type"], "reasoning");
  EXPECT_EQ(r1["output"][1]["content"][0]["text"], "Checking.");
  const json& call = r1["output"][2];
  EXPECT_EQ(call["type"], "function_call");
  json input = json::array({{{"role", "user"}, {"content", "Weather?"}}});
  for (const auto& item : r1["output"]) input.push_back(item);
  input.push_back({{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "sunny"}});
  const std::string body =
      post_stream(*client_, "/v1/responses",
                  {{"input", input}, {"tools", tools}, {"reasoning", {{"effort", "high"}}}, {"stream", true}});
  const auto events = test::parse_sse(body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().event, "response.created");
  EXPECT_EQ(events.back().event, "response.completed");
  const json done = json::parse(events.back().data)["response"];
  EXPECT_EQ(done["output"].back()["content"][0]["text"], "Sunny.");
  const int turn1 = r1["usage"]["input_tokens"].get<int>() + r1["usage"]["output_tokens"].get<int>();
  EXPECT_EQ(done["usage"]["input_tokens_details"]["cached_tokens"], turn1);
}

TEST_F(HttpServerTest, AnthropicMessagesRoundTrip) {
  start({{"<tool_result>", "Rain." + std::string(test::kEos)}, {"", kToolCall}});
  const json tools = json::parse(
      R"([{"name": "get_weather", "description": "Weather of a city", "input_schema": {"type": "object"}}])");
  int status = 0;
  const json r1 = post_json(*client_, "/v1/messages",
                            {{"model", "m"}, {"max_tokens", 1000}, {"tools", tools}, {"messages", {user("Weather?")}}},
                            &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(r1["stop_reason"], "tool_use");
  ASSERT_EQ(r1["content"].size(), 2u);
  const json& tool_use = r1["content"][1];
  EXPECT_EQ(tool_use["input"], json::parse(R"({"city": "Paris", "days": 3})"));
  EXPECT_EQ(tool_use["id"].get<std::string>().rfind("toolu_", 0), 0u);
  const json messages = {user("Weather?"),
                         {{"role", "assistant"}, {"content", r1["content"]}},
                         {{"role", "user"},
                          {"content", {{{"type", "tool_result"}, {"tool_use_id", tool_use["id"]}, {"content", "rain"}}}}}};
  const std::string body = post_stream(
      *client_, "/v1/messages",
      {{"model", "m"}, {"max_tokens", 1000}, {"tools", tools}, {"messages", messages}, {"stream", true}});
  const auto events = test::parse_sse(body);
  ASSERT_GE(events.size(), 6u);
  EXPECT_EQ(events.front().event, "message_start");
  EXPECT_EQ(events.back().event, "message_stop");
  std::string text;
  json final_usage;
  for (const auto& e : events) {
    const json d = json::parse(e.data);
    if (e.event == "content_block_delta" && d["delta"]["type"] == "text_delta") text += d["delta"]["text"];
    if (e.event == "message_delta") final_usage = d["usage"];
  }
  EXPECT_EQ(text, "Rain.");
  const int turn1 = r1["usage"]["input_tokens"].get<int>() + r1["usage"]["output_tokens"].get<int>();
  EXPECT_EQ(final_usage["cache_read_input_tokens"], turn1);

  const json count = post_json(*client_, "/v1/messages/count_tokens", {{"model", "m"}, {"messages", {user("hi")}}});
  EXPECT_EQ(count["input_tokens"], 6);
}

// A request that does not choose a mode thinks, on every API (DeepSeek's default, deepseek-recipe's
// ConversionOptions()); `--thinking off` makes chat mode the default.
TEST_F(HttpServerTest, DefaultModeIsThinkingOnEveryApi) {
  for (bool server_default : {true, false}) {
    client_.reset();
    server_.reset();  // before the engine it serves
    engine_ = test::make_engine({{"<｜Assistant｜><think>", "why</think>fine" + std::string(test::kEos)},
                                 {"<｜Assistant｜></think>", "chat" + std::string(test::kEos)}});
    ServerOptions options;
    options.service.default_thinking = server_default;
    server_ = std::make_unique<test::TestServer>(*engine_, options, /*server_default_thinking=*/true);
    client_ = server_->client();
    SCOPED_TRACE(server_default ? "default" : "--thinking off");
    const json chat = post_json(*client_, "/v1/chat/completions", {{"messages", {user("hi")}}});
    const json responses = post_json(*client_, "/v1/responses", {{"input", "hi"}});
    const json messages = post_json(*client_, "/v1/messages", {{"max_tokens", 64}, {"messages", {user("hi")}}});
    if (server_default) {
      EXPECT_EQ(chat["choices"][0]["message"]["reasoning_content"], "why");
      EXPECT_EQ(chat["choices"][0]["message"]["content"], "fine");
      ASSERT_EQ(responses["output"].size(), 2u) << responses.dump();
      EXPECT_EQ(responses["output"][0]["type"], "reasoning");
      EXPECT_EQ(responses["output"][1]["content"][0]["text"], "fine");
      ASSERT_EQ(messages["content"].size(), 2u) << messages.dump();
      EXPECT_EQ(messages["content"][0]["thinking"], "why");
      EXPECT_EQ(messages["content"][1]["text"], "fine");
    } else {
      EXPECT_EQ(chat["choices"][0]["message"]["content"], "chat");
      EXPECT_EQ(responses["output"].back()["content"][0]["text"], "chat");
      EXPECT_EQ(messages["content"].back()["text"], "chat");
    }
  }
}

TEST_F(HttpServerTest, LegacyCompletions) {
  start({{"", " upon a time" + std::string(test::kEos)}});
  const json r = post_json(*client_, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 50}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], " upon a time");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 4);
  const auto events = test::parse_sse(post_stream(*client_, "/v1/completions", {{"prompt", "Once"}, {"stream", true}}));
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) text += json::parse(events[i].data)["choices"][0]["text"];
  EXPECT_EQ(text, " upon a time");
  EXPECT_EQ(events.back().data, "[DONE]");
}

TEST_F(HttpServerTest, StopStringsAndMaxTokens) {
  start({{"", "one two three" + std::string(test::kEos)}});
  const json r = post_json(*client_, "/v1/chat/completions", {{"messages", {user("count")}}, {"stop", {"thr"}}});
  EXPECT_EQ(r["choices"][0]["message"]["content"], "one two ");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  const json cut = post_json(*client_, "/v1/chat/completions", {{"messages", {user("count")}}, {"max_tokens", 3}});
  EXPECT_EQ(cut["choices"][0]["message"]["content"], "one");
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");
  const json a = post_json(*client_, "/v1/messages",
                           {{"max_tokens", 100}, {"stop_sequences", {"two"}}, {"messages", {user("count")}}});
  EXPECT_EQ(a["stop_reason"], "stop_sequence");
  EXPECT_EQ(a["stop_sequence"], "two");
  EXPECT_EQ(a["content"][0]["text"], "one ");
}

// --max-tokens is the default output budget and also the most a request may ask: a larger max_tokens
// is clamped to it (the turn ends with "length"), on every API.
TEST_F(HttpServerTest, MaxTokensFlagCapsWhatARequestMayAsk) {
  ServerOptions options;
  options.service.default_max_tokens = 3;
  start({{"", "one two three" + std::string(test::kEos)}}, options);
  for (const json& extra : {json{{"max_tokens", 100}}, json{{"max_completion_tokens", 100}}, json::object()}) {
    json body = {{"messages", {user("count")}}};
    body.update(extra);
    const json r = post_json(*client_, "/v1/chat/completions", body);
    EXPECT_EQ(r["choices"][0]["message"]["content"], "one") << extra.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length") << extra.dump();
    EXPECT_EQ(r["usage"]["completion_tokens"], 3) << extra.dump();
  }
  const json a = post_json(*client_, "/v1/messages", {{"max_tokens", 100}, {"messages", {user("count")}}});
  EXPECT_EQ(a["stop_reason"], "max_tokens");
  EXPECT_EQ(a["usage"]["output_tokens"], 3);
  const json fewer = post_json(*client_, "/v1/chat/completions", {{"messages", {user("count")}}, {"max_tokens", 1}});
  EXPECT_EQ(fewer["usage"]["completion_tokens"], 1) << "a smaller max_tokens is kept";
}

// The bounded body parser's limits reach the client as a 400 in the endpoint's error shape, naming the
// limit (json_body_test covers each limit).
TEST_F(HttpServerTest, JsonBodyLimitsAre400sNamingTheLimit) {
  start({{"", kAnswer}});
  std::string many_keys = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"metadata\":{";
  for (int i = 0; i <= 10000; ++i) many_keys += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":0";
  many_keys += "}}";
  auto openai = client_->Post("/v1/chat/completions", many_keys, "application/json");
  ASSERT_TRUE(openai);
  EXPECT_EQ(openai->status, 400);
  EXPECT_NE(json::parse(openai->body)["error"]["message"].get<std::string>().find("more than 10,000 keys"),
            std::string::npos)
      << openai->body;
  std::string empties = "{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"x\":[{}";
  for (int i = 0; i < 1100000; ++i) empties += ",{}";
  empties += "]}";
  auto anthropic = client_->Post("/v1/messages", empties, "application/json");
  ASSERT_TRUE(anthropic);
  EXPECT_EQ(anthropic->status, 400);
  const json a = json::parse(anthropic->body);
  EXPECT_EQ(a["type"], "error");
  EXPECT_NE(a["error"]["message"].get<std::string>().find("more than 1,048,576 JSON values"), std::string::npos)
      << anthropic->body;
  // A repeated key takes its last value, as Python's json (DeepSeek's API) reads it.
  const json r = post_json(*client_, "/v1/chat/completions",
                           json::parse(R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1})"));
  EXPECT_EQ(r["usage"]["completion_tokens"], 1);
  auto repeated = client_->Post("/v1/chat/completions",
                                R"({"max_tokens":1,"messages":[{"role":"user","content":"hi"}],"max_tokens":2})",
                                "application/json");
  ASSERT_TRUE(repeated);
  EXPECT_EQ(json::parse(repeated->body)["usage"]["completion_tokens"], 2) << repeated->body;
}

TEST_F(HttpServerTest, ErrorsAreJsonInTheApisShape) {
  start({{"", kAnswer}}, {}, {}, /*max_context=*/64);
  auto bad = client_->Post("/v1/chat/completions", "{not json", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["type"], "invalid_request_error");
  auto bad_anthropic = client_->Post("/v1/messages", "[]", "application/json");
  ASSERT_TRUE(bad_anthropic);
  EXPECT_EQ(bad_anthropic->status, 400);
  EXPECT_EQ(json::parse(bad_anthropic->body)["type"], "error");
  EXPECT_EQ(json::parse(bad_anthropic->body)["error"]["type"], "invalid_request_error");
  auto missing = client_->Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["type"], "not_found_error");
  int status = 0;
  const json too_long =
      post_json(*client_, "/v1/chat/completions", {{"messages", {user(std::string(100, 'x'))}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(too_long["error"]["code"], "context_length_exceeded");
}

TEST_F(HttpServerTest, OversizeBodyIs413) {
  ServerOptions options;
  options.max_body_bytes = 4096;
  start({{"", kAnswer}}, options);
  const std::string big = json({{"messages", {user(std::string(10000, 'x'))}}}).dump();
  auto res = client_->Post("/v1/chat/completions", big, "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 413);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "request_too_large");
  auto health = server_->client()->Get("/health");  // still serving
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST_F(HttpServerTest, APortInUseIsRefusedNotShared) {
  // With SO_REUSEPORT (httplib's default) a second server could bind the same port and take a share
  // of the first one's connections; cedar must refuse instead.
  start({{"", kAnswer}});
  auto engine = test::make_engine({{"", kAnswer}});
  ServerOptions options;
  options.port = server_->port();
  ApiServer second(*engine, test::test_tokenizer(), options);
  auto bound = second.bind();
  ASSERT_FALSE(bound.ok());
  EXPECT_EQ(bound.status().code(), StatusCode::kIo);
  EXPECT_NE(bound.status().message().find(std::to_string(server_->port())), std::string::npos);
}

TEST_F(HttpServerTest, ApiKeyIsRequiredWhenSet) {
  ServerOptions options;
  options.api_key = "sekret";
  start({{"", kAnswer}}, options);
  const std::string body = json({{"messages", {user("hi")}}}).dump();
  auto none = client_->Post("/v1/chat/completions", body, "application/json");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["type"], "authentication_error");
  auto wrong = client_->Post("/v1/chat/completions", {{"Authorization", "Bearer nope"}}, body, "application/json");
  EXPECT_EQ(wrong->status, 401);
  auto right = client_->Post("/v1/chat/completions", {{"Authorization", "Bearer sekret"}}, body, "application/json");
  EXPECT_EQ(right->status, 200);
  auto anthropic = client_->Post("/v1/messages", {{"x-api-key", "sekret"}},
                                 json({{"max_tokens", 10}, {"messages", {user("hi")}}}).dump(), "application/json");
  EXPECT_EQ(anthropic->status, 200);
  auto anthropic_wrong = client_->Post("/v1/messages", {{"x-api-key", "x"}}, "{}", "application/json");
  EXPECT_EQ(anthropic_wrong->status, 401);
  EXPECT_EQ(json::parse(anthropic_wrong->body)["error"]["type"], "authentication_error");
  EXPECT_EQ(client_->Get("/metrics")->status, 401);
  EXPECT_EQ(client_->Get("/health")->status, 200);  // liveness probes need no key
}

TEST_F(HttpServerTest, FullQueueAnswers429WithRetryAfter) {
  ServerOptions options;
  ScriptedEngineOptions slow;
  slow.token_delay = 10ms;
  slow.max_batch = 1;  // the engine's queue is the server's only one
  slow.max_queue = 0;
  start({{"", std::string(100, 'x') + test::kEos}}, options, slow);
  std::thread busy([&] { post_json(*server_->client(), "/v1/chat/completions", {{"messages", {user("a")}}}); });
  std::this_thread::sleep_for(200ms);  // the first request is inside the engine (1 s of tokens)
  auto res = client_->Post("/v1/chat/completions", json({{"messages", {user("b")}}}).dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429);
  EXPECT_FALSE(res->get_header_value("Retry-After").empty());
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "rate_limit_exceeded");
  busy.join();
}

TEST_F(HttpServerTest, ClientDisconnectCancelsTheGeneration) {
  ScriptedEngineOptions slow;
  slow.token_delay = 5ms;
  start({{"", std::string(2000, 'x') + test::kEos}}, {}, slow);  // 10 s if nobody stops it
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = json({{"messages", {user("go")}}, {"stream", true}}).dump();
  req.set_header("Content-Type", "application/json");
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 5; };
  const auto t0 = std::chrono::steady_clock::now();
  client_->send(req);  // ends when the receiver returns false
  // The engine must stop soon after: its cumulative output stays far below the 2000 tokens.
  for (int i = 0; i < 200 && engine_->stats().requests == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(engine_->stats().requests, 1u);
  EXPECT_LT(engine_->stats().output_tokens, 1000u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  std::string metrics;
  for (int i = 0; i < 200 && metrics.find("cedar_client_disconnects_total 1") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
    metrics = server_->client()->Get("/metrics")->body;
  }
  EXPECT_NE(metrics.find("cedar_client_disconnects_total 1"), std::string::npos) << metrics;
}

TEST_F(HttpServerTest, EngineErrorsBecomeApiErrors) {
  start({{"only this", kAnswer}});  // nothing else matches: the engine answers InvalidArgument
  int status = 0;
  const json r = post_json(*client_, "/v1/chat/completions", {{"messages", {user("hi")}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("no reply"), std::string::npos);
  const std::string stream =
      post_stream(*client_, "/v1/chat/completions", {{"messages", {user("hi")}}, {"stream", true}}, &status);
  EXPECT_EQ(status, 200);  // the stream had begun: the error is its last event
  const auto events = test::parse_sse(stream);
  ASSERT_GE(events.size(), 2u);
  EXPECT_TRUE(json::parse(events[events.size() - 2].data).contains("error"));
}

// Malformed DSML is read as deepseek-recipe 0.2.0 reads it, not refused: an invoke without its
// name attribute is skipped, so this turn has neither calls nor content (recipe's answer), and no
// markup leaks.
TEST_F(HttpServerTest, MalformedModelOutputIsReadAsDeepseekRecipeReadsIt) {
  start({{"", "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke nme=\"x\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>" +
                  std::string(test::kEos)}});
  int status = 0;
  const json r = post_json(*client_, "/v1/chat/completions", {{"messages", {user("hi")}}, {"tools", kTools}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const json& message = r["choices"][0]["message"];
  EXPECT_FALSE(message.contains("tool_calls") && !message["tool_calls"].empty()) << r.dump();
  EXPECT_TRUE(message["content"].is_null() || message["content"] == "") << r.dump();
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
}

// tool_choice "none" (or no tools at all): what the model writes is content, never a tool call, as
// deepseek-recipe 0.2.0 parses it (parse_tool_calls false: the DSML stays in the content).
TEST_F(HttpServerTest, ToolChoiceNoneReturnsNoToolCalls) {
  start({{"", kToolCall}});
  for (const json& extra : {json{{"tools", kTools}, {"tool_choice", "none"}}, json::object()}) {
    json body = {{"messages", {user("weather?")}}};
    body.update(extra);
    int status = 0;
    const json r = post_json(*client_, "/v1/chat/completions", body, &status);
    ASSERT_EQ(status, 200) << r.dump();
    const json& message = r["choices"][0]["message"];
    EXPECT_FALSE(message.contains("tool_calls") && !message["tool_calls"].empty()) << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
    EXPECT_NE(message["content"].get<std::string>().find("<｜DSML｜ invoke name=\"get_weather\">"), std::string::npos);
  }
}

}  // namespace
}  // namespace cedar::serve
