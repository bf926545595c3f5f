// The server's prompt path (OpenAI request JSON -> schema -> ChatService::prepare_chat -> token ids)
// must reproduce the official V4.1 encoder's prompts in tests/tokenizer/data/official/v41-encode-public.jsonl,
// with the request expressed the way an API client sends it: tools and response_format at the top
// level, thinking and effort through reasoning_effort / thinking.
#include <gtest/gtest.h>

#include "serve/api/chat_service.h"
#include "serve/api/openai_schema.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

class PromptTest : public ::testing::Test {
 protected:
  PromptTest()
      : engine_(test::make_engine({{"", "x"}})),
        service_(test::test_tokenizer(), *engine_, replay_, ServiceConfig{"cedar-test"}) {}

  // The prompt text of a chat request body, or the error's message.
  std::string prompt_of(const test::json& body, int* status = nullptr) {
    OrderedJson parsed = OrderedJson::parse(body.dump());
    ChatRequest request;
    if (SchemaError e = parse_chat_completion_request(parsed, &request)) {
      if (status) *status = e->http_status();
      return e->message;
    }
    auto prepared = service_.prepare_chat(request, "chatcmpl-", "call_");
    if (const ApiError* e = std::get_if<ApiError>(&prepared)) {
      if (status) *status = e->http_status();
      return e->message;
    }
    if (status) *status = 200;
    auto text = test::test_tokenizer().decode(std::get<PreparedGeneration>(prepared).request.prompt_ids);
    return text.ok() ? *text : text.status().to_string();
  }

  std::unique_ptr<ScriptedEngine> engine_;
  ReplayStore replay_;
  ChatService service_;
};

// V4.1's own effort aliases (spec §6.2), used to express the golden cases numerically: cedar's API
// words follow deepseek-recipe's conversion instead (its "high" renders 75, and a thinking request
// without an effort gets that too), so the aliases are not passed and the encoder's default (null)
// is passed as its value, 50.
int v41_alias(const std::string& word) {
  if (word.empty()) return 50;
  if (word == "low") return 25;
  if (word == "high") return 50;
  if (word == "xhigh") return 75;
  return 100;  // max
}

TEST_F(PromptTest, ReproducesTheOfficialEncoderThroughTheApi) {
  const auto cases = test::read_jsonl(test::official_dir() + "/v41-encode-public.jsonl");
  ASSERT_FALSE(cases.empty());
  int compared = 0;
  for (const auto& c : cases) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    // Not expressible through the API, by design:
    //  - drop_thinking=false: the server always uses the encoder's default;
    //  - tools on a user message: the official encoder ignores them, cedar puts them in the system
    //    prompt where the model can see them;
    //  - a final assistant message: cedar opens a new turn after it (deepseek-recipe's rule), the
    //    encoder ends with it;
    //  - invalid efforts: cedar's API rejects them before the encoder (checked below);
    //  - response formats and tools: the API renders them as deepseek-recipe does (the schema
    //    itself; exactly name, description and parameters), which tests/serve/recipe checks.
    if (!c["drop_thinking"].get<bool>() || name == "tool_args_string_and_json" || name == "assistant_last_no_header" ||
        c.contains("error") || c["messages"][0].contains("response_format") || c["messages"][0].contains("tools"))
      continue;
    test::json messages = c["messages"];
    test::json body = {{"model", "cedar-test"}};
    for (const char* key : {"tools", "response_format"}) {
      if (messages[0].contains(key)) {
        body[key] = messages[0][key];
        messages[0].erase(key);
      }
    }
    body["messages"] = messages;
    const bool thinking = c["thinking_mode"] == "thinking";
    body["thinking"] = {{"type", thinking ? "enabled" : "disabled"}};
    const auto& effort = c["reasoning_effort"];
    if (effort.is_number_integer()) body["reasoning_effort"] = effort;
    if (effort.is_string()) body["reasoning_effort"] = v41_alias(effort);
    if (effort.is_null() && thinking) body["reasoning_effort"] = v41_alias("");
    int status = 0;
    EXPECT_EQ(prompt_of(body, &status), c["prompt"].get<std::string>());
    EXPECT_EQ(status, 200);
    ++compared;
  }
  EXPECT_GE(compared, 15);
}

TEST_F(PromptTest, InvalidEffortsAreRejected) {
  for (const test::json& effort : {test::json(0), test::json(101), test::json("extreme")}) {
    int status = 0;
    prompt_of({{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"reasoning_effort", effort}}, &status);
    EXPECT_EQ(status, 400) << effort.dump();
  }
}

TEST_F(PromptTest, ToolsWithoutASystemMessageGetOne) {
  const test::json body = {
      {"messages", {{{"role", "user"}, {"content", "hi"}}}},
      {"thinking", {{"type", "disabled"}}},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}}}}};
  const std::string prompt = prompt_of(body);
  EXPECT_EQ(prompt.rfind("<｜begin▁of▁sentence｜><｜System｜>\n\n## Tools\n", 0), 0u) << prompt;
  EXPECT_NE(prompt.find("{\"name\": \"f\", \"description\": \"\", \"parameters\": {\"type\": \"object\"}}"),
            std::string::npos);
  EXPECT_NE(prompt.find("<｜User｜>hi<｜Assistant｜></think>"), std::string::npos);
}

TEST_F(PromptTest, ToolChoiceNoneLeavesToolsOut) {
  const test::json body = {
      {"messages", {{{"role", "user"}, {"content", "hi"}}}},
      {"thinking", {{"type", "disabled"}}},
      {"tool_choice", "none"},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}};
  EXPECT_EQ(prompt_of(body), "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>");
}

// The expected prompts below are deepseek-recipe 0.2.0's (ConversionOptions(), DeepseekV41Encoding)
// for the same bodies. A trailing assistant message is a finished turn: its reasoning is history,
// and a new turn follows in the request's mode.
TEST_F(PromptTest, TrailingAssistantMessageIsAFinishedTurn) {
  const std::string effort =
      "<｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
  test::json body = {{"messages",
                      {{{"role", "user"}, {"content", "hi"}},
                       {{"role", "assistant"}, {"content", "Let me"}, {"reasoning_content", "r1"}}}}};
  EXPECT_EQ(prompt_of(body), "<｜begin▁of▁sentence｜>" + effort +
                                 "<｜User｜>hi<｜Assistant｜></think>Let me<｜end▁of▁sentence｜><｜Assistant｜><think>");
  body["thinking"] = {{"type", "disabled"}};
  EXPECT_EQ(prompt_of(body),
            "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>Let me<｜end▁of▁sentence｜><｜Assistant｜></think>");
  // Every assistant message is a turn of its own.
  body["messages"].push_back({{"role", "assistant"}, {"content", "b"}});
  EXPECT_EQ(prompt_of(body),
            "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>Let me<｜end▁of▁sentence｜><｜Assistant｜></think>b"
            "<｜end▁of▁sentence｜><｜Assistant｜></think>");
  // A trailing turn with calls but no results is refused, as deepseek-recipe refuses it.
  const test::json calls = {
      {"messages",
       {{{"role", "user"}, {"content", "hi"}},
        {{"role", "assistant"},
         {"content", ""},
         {"tool_calls", {{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}}}}}}},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}};
  int status = 0;
  EXPECT_NE(prompt_of(calls, &status).find("tool calls"), std::string::npos);
  EXPECT_EQ(status, 400);
}

// Chat Completions' `prefix: true` continues the final assistant message: in thinking mode after
// its reasoning, or inside the reasoning while it has no answer (deepseek-recipe's prompts).
TEST_F(PromptTest, PrefixContinuesTheLastAssistantMessage) {
  const std::string head =
      "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough "
      "the reasoning)\n\n<｜User｜>hi<｜Assistant｜>";
  auto with_last = [](test::json last) {
    last["role"] = "assistant";
    last["prefix"] = true;
    return test::json{{"messages", {{{"role", "user"}, {"content", "hi"}}, last}}};
  };
  EXPECT_EQ(prompt_of(with_last({{"content", "Let me"}})), head + "<think></think>Let me");
  EXPECT_EQ(prompt_of(with_last({{"content", "Let me"}, {"reasoning_content", "r1"}})),
            head + "<think>r1</think>Let me");
  EXPECT_EQ(prompt_of(with_last({{"content", ""}, {"reasoning_content", "r1"}})), head + "<think>r1");
  EXPECT_EQ(prompt_of(with_last({{"content", ""}})), head + "<think>");
  test::json off = with_last({{"content", "Let me"}, {"reasoning_content", "r1"}});
  off["thinking"] = {{"type", "disabled"}};
  EXPECT_EQ(prompt_of(off), "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>Let me");

  // Refused: prefix on a message other than the last, with tools, with a json_object format (as
  // deepseek-recipe refuses them), with a json_schema format (cedar cannot constrain a continued
  // answer), and a prefix that is not a boolean.
  test::json not_last = with_last({{"content", "a"}});
  not_last["messages"].push_back({{"role", "user"}, {"content", "more"}});
  test::json tools = with_last({{"content", "a"}});
  tools["tools"] = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  tools["tool_choice"] = "none";
  test::json json_object = with_last({{"content", "{"}});
  json_object["messages"][0]["content"] = "json please";
  json_object["response_format"] = {{"type", "json_object"}};
  test::json json_schema = with_last({{"content", "{"}});
  json_schema["response_format"] = {{"type", "json_schema"},
                                    {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}};
  test::json not_bool = with_last({{"content", "a"}});
  not_bool["messages"][1]["prefix"] = "yes";
  for (const test::json& refused : {not_last, tools, json_object, json_schema, not_bool}) {
    int status = 0;
    EXPECT_NE(prompt_of(refused, &status).find("prefix"), std::string::npos) << refused.dump();
    EXPECT_EQ(status, 400) << refused.dump();
  }
}

// A request that does not choose a mode runs in thinking mode with effort 75, as on DeepSeek's API:
// the prompt deepseek-recipe 0.2.0 renders with ConversionOptions() for {"messages": [user "hi"]}.
// `cedar serve --thinking off` (ServiceConfig::default_thinking = false) makes it chat mode.
TEST_F(PromptTest, DefaultModeIsDeepSeeksThinking) {
  const test::json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  EXPECT_EQ(prompt_of(body),
            "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (range 1-100, the higher the value, the more "
            "thorough the reasoning)\n\n<｜User｜>hi<｜Assistant｜><think>");
  ServiceConfig chat_default{"cedar-test"};
  chat_default.default_thinking = false;
  ChatService chat_service(test::test_tokenizer(), *engine_, replay_, chat_default);
  ChatRequest request;
  ASSERT_FALSE(parse_chat_completion_request(OrderedJson::parse(body.dump()), &request));
  auto prepared = chat_service.prepare_chat(request, "chatcmpl-", "call_");
  ASSERT_TRUE(std::holds_alternative<PreparedGeneration>(prepared));
  auto chat_prompt = test::test_tokenizer().decode(std::get<PreparedGeneration>(prepared).request.prompt_ids);
  ASSERT_TRUE(chat_prompt.ok());
  EXPECT_EQ(*chat_prompt, "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>");
  // A forced tool call needs chat mode: refused under the default, as deepseek-recipe refuses it.
  test::json forced = body;
  forced["tools"] = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  forced["tool_choice"] = "required";
  int status = 0;
  EXPECT_NE(prompt_of(forced, &status).find("tool_choice"), std::string::npos);
  EXPECT_EQ(status, 400);
}

TEST(PromptLimits, TooLongPromptsAndBudgetsAreHandled) {
  auto engine = test::make_engine({{"", "x"}}, {}, /*max_context=*/64);
  ReplayStore replay;
  ChatService service(test::test_tokenizer(), *engine, replay, ServiceConfig{"cedar-test"});
  ChatRequest request;
  request.messages.push_back({Role::kUser, std::string(100, 'a'), "", {}, ""});
  request.reasoning.thinking = false;
  auto too_long = service.prepare_chat(request, "x-", "call_");
  ASSERT_TRUE(std::holds_alternative<ApiError>(too_long));
  EXPECT_EQ(std::get<ApiError>(too_long).kind, ErrorKind::kContextTooLong);
  EXPECT_EQ(std::string(std::get<ApiError>(too_long).openai_code()), "context_length_exceeded");

  request.messages[0].content = "hi";  // BOS + <User> + 2 + <Assistant> + </think> = 6 tokens
  request.sampling.max_tokens = 1000;  // clamped to what the context has left
  auto fits = service.prepare_chat(request, "x-", "call_");
  ASSERT_TRUE(std::holds_alternative<PreparedGeneration>(fits));
  EXPECT_EQ(std::get<PreparedGeneration>(fits).request.prompt_ids.size(), 6u);
  EXPECT_EQ(std::get<PreparedGeneration>(fits).request.sampling.max_tokens, 64 - 6);
}

}  // namespace
}  // namespace cedar::serve
