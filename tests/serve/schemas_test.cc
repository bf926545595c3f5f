// Wire schemas: request bodies (hand-written in each API's documented shape) into the neutral
// ChatRequest, and neutral turns back into each API's response and event stream.
#include <gtest/gtest.h>

#include "serve/api/anthropic_schema.h"
#include "serve/api/openai_schema.h"
#include "serve/api/responses_schema.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

OrderedJson body_of(const char* text) { return OrderedJson::parse(text); }

Completion sample_turn() {
  Completion c;
  c.id = "id-1";
  c.created = 1700000000;
  c.model = "cedar-test";
  c.reasoning = "think";
  c.content = "Checking.";
  c.tool_calls = {{"call_a", "get_weather", "{\"city\": \"Paris\", \"days\": 3}"}};
  c.finish = FinishKind::kToolCalls;
  c.usage = {20, 7, 12, 2};
  return c;
}

// ---- OpenAI Chat Completions.

TEST(OpenAiSchema, ParsesAToolConversation) {
  ChatRequest r;
  const SchemaError e = parse_chat_completion_request(body_of(R"({
    "model": "m", "max_completion_tokens": 50, "temperature": 0.5, "seed": 7, "stop": "END",
    "stream": true, "stream_options": {"include_usage": true}, "reasoning_effort": "low",
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
    "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
      {"role": "assistant", "content": null, "reasoning_content": "need tool",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "rain"}]})"),
                                                      &r);
  ASSERT_FALSE(e.has_value()) << e->message;
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, Role::kSystem);
  EXPECT_EQ(r.messages[1].content, "Weather?");
  EXPECT_EQ(r.messages[2].reasoning, "need tool");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].id, "c1");
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(r.messages[3].role, Role::kTool);
  EXPECT_EQ(r.messages[3].tool_call_id, "c1");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(to_wire(r.tools[0]), R"({"name":"get_weather","parameters":{"type":"object"}})");
  EXPECT_EQ(r.sampling.max_tokens, 50);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.stream.stream);
  EXPECT_TRUE(r.stream.include_usage);
  EXPECT_EQ(r.reasoning.thinking, true);
  EXPECT_EQ(r.reasoning.effort, 50);  // deepseek-recipe renders "low" as Reasoning Effort: 50
}

TEST(OpenAiSchema, RejectionsNameTheParameter) {
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({"messages": []})", "messages"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role"},
      // An image by URL (not a base64 data URL): the server fetches nothing.
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
       "messages[0].content[0].image_url"},
      {R"({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]})",
       "messages[0].content[0].type"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "messages[0].tool_call_id"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 2})", "n"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})", "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens"},
      // deepseek-recipe's ConversionOptions() bound (393216) refuses more, thinking or not.
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 393217})", "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search"}]})", "tools[0].type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})", "response_format.type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 1})", "presence_penalty"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "stream"},
  };
  for (const Case& c : cases) {
    ChatRequest r;
    const SchemaError e = parse_chat_completion_request(body_of(c.body), &r);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->http_status(), 400) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << " -> " << e->message;
  }
}

TEST(OpenAiSchema, ThinkingSwitchAndEffortCombine) {
  ChatRequest a, b, c;
  ASSERT_FALSE(parse_chat_completion_request(
      body_of(R"({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled"}})"), &a));
  EXPECT_EQ(a.reasoning.thinking, true);
  EXPECT_FALSE(a.reasoning.effort.has_value());
  ASSERT_FALSE(parse_chat_completion_request(
      body_of(R"({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "disabled"}, "reasoning_effort": 80})"),
      &b));
  EXPECT_EQ(b.reasoning.thinking, false);  // the explicit switch wins
  ASSERT_FALSE(parse_chat_completion_request(
      body_of(R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "none"})"), &c));
  EXPECT_EQ(c.reasoning.thinking, false);
}

TEST(OpenAiSchema, RendersAChatCompletion) {
  const auto body = test::json::parse(render_chat_completion(sample_turn()));
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["id"], "id-1");
  const auto& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "Checking.");
  EXPECT_EQ(choice["message"]["reasoning_content"], "think");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["id"], "call_a");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\", \"days\": 3}");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 20);
  EXPECT_EQ(body["usage"]["completion_tokens"], 7);
  EXPECT_EQ(body["usage"]["total_tokens"], 27);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 12);
  EXPECT_EQ(body["usage"]["completion_tokens_details"]["reasoning_tokens"], 2);
}

TEST(OpenAiSchema, StreamsChunksThenDone) {
  ChatCompletionStream s(/*include_usage=*/true);
  const Completion c = sample_turn();
  s.on_start(c);
  s.on_reasoning("think");
  s.on_content("Checking.", {});
  s.on_tool_call(0, c.tool_calls[0]);
  s.on_finish(c);
  const auto events = test::parse_sse(s.take());
  ASSERT_EQ(events.size(), 7u);
  EXPECT_EQ(test::json::parse(events[0].data)["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(test::json::parse(events[1].data)["choices"][0]["delta"]["reasoning_content"], "think");
  EXPECT_EQ(test::json::parse(events[2].data)["choices"][0]["delta"]["content"], "Checking.");
  const auto tc = test::json::parse(events[3].data)["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(tc["index"], 0);
  EXPECT_EQ(tc["id"], "call_a");
  EXPECT_EQ(tc["function"]["name"], "get_weather");
  EXPECT_EQ(test::json::parse(events[4].data)["choices"][0]["finish_reason"], "tool_calls");
  const auto usage_chunk = test::json::parse(events[5].data);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"], 12);
  EXPECT_EQ(events[6].data, "[DONE]");
  for (const auto& e : events) EXPECT_TRUE(e.event.empty());
}

TEST(OpenAiSchema, ErrorBodyShape) {
  const auto body = test::json::parse(render_openai_error({ErrorKind::kContextTooLong, "too long", "messages"}));
  EXPECT_EQ(body["error"]["message"], "too long");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "messages");
  EXPECT_EQ(body["error"]["code"], "context_length_exceeded");
}

TEST(OpenAiSchema, CompletionRequest) {
  CompletionRequest r;
  ASSERT_FALSE(parse_completion_request(body_of(R"({"prompt": ["Once"], "max_tokens": 5})"), &r));
  EXPECT_EQ(r.prompt, "Once");
  EXPECT_EQ(r.sampling.max_tokens, 5);
  EXPECT_TRUE(parse_completion_request(body_of(R"({"prompt": ["a", "b"]})"), &r).has_value());
  EXPECT_TRUE(parse_completion_request(body_of(R"({"prompt": "x", "echo": true})"), &r).has_value());
  EXPECT_TRUE(parse_completion_request(body_of(R"({"prompt": "x", "suffix": "y"})"), &r).has_value());
}

// ---- OpenAI Responses.

TEST(ResponsesSchema, InputItemsBecomeTurns) {
  ChatRequest r;
  const SchemaError e = parse_responses_request(body_of(R"({
    "model": "m", "instructions": "Be brief.", "max_output_tokens": 64, "store": false,
    "reasoning": {"effort": "high"}, "include": ["reasoning.encrypted_content"],
    "tools": [{"type": "function", "name": "shell", "description": "run", "parameters": {"type": "object"}, "strict": false}],
    "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
    "input": [
      {"role": "user", "content": "list files"},
      {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "plan it"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
      {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"cmd\": \"ls\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
      {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]}]})"),
                                                &r);
  ASSERT_FALSE(e.has_value()) << e->message;
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, Role::kSystem);
  EXPECT_EQ(r.messages[0].content, "Be brief.");
  EXPECT_EQ(r.messages[1].content, "list files");
  // Reasoning, message and function call are one assistant turn.
  EXPECT_EQ(r.messages[2].role, Role::kAssistant);
  EXPECT_EQ(r.messages[2].reasoning, "plan it");
  EXPECT_EQ(r.messages[2].content, "Sure.");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].id, "call_1");
  EXPECT_EQ(r.messages[3].role, Role::kTool);
  EXPECT_EQ(r.messages[3].content, "a.txt");
  EXPECT_EQ(r.messages[4].content, "thanks");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(to_wire(r.tools[0]),
            R"({"name":"shell","description":"run","parameters":{"type":"object"},"strict":false})");
  ASSERT_TRUE(r.response_format.has_value());
  EXPECT_EQ(to_wire(*r.response_format), R"({"type":"object"})");  // the prompt shows the schema itself
  EXPECT_EQ(r.reasoning.effort, 75);
  EXPECT_EQ(r.sampling.max_tokens, 64);
}

TEST(ResponsesSchema, MaxOutputTokensFollowsDeepseekRecipesBound) {
  ChatRequest r;
  EXPECT_FALSE(parse_responses_request(body_of(R"({"input": "x", "max_output_tokens": 393216})"), &r));
  EXPECT_EQ(r.sampling.max_tokens, 393216);
  const SchemaError e = parse_responses_request(body_of(R"({"input": "x", "max_output_tokens": 393217})"), &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "max_output_tokens");
  EXPECT_NE(e->message.find("393216"), std::string::npos) << e->message;
}

TEST(ResponsesSchema, RefusesWhatNeedsServerState) {
  ChatRequest r;
  EXPECT_EQ(parse_responses_request(body_of(R"({"input": "x", "previous_response_id": "resp_1"})"), &r)->param,
            "previous_response_id");
  EXPECT_EQ(parse_responses_request(body_of(R"({"input": [{"type": "item_reference", "id": "x"}]})"), &r)->param,
            "input[0].type");
  EXPECT_EQ(parse_responses_request(body_of(R"({"input": "x", "tools": [{"type": "web_search"}]})"), &r)->param,
            "tools[0].type");
  EXPECT_EQ(parse_responses_request(body_of(R"({"model": "m"})"), &r)->param, "input");
}

TEST(ResponsesSchema, RendersOutputItems) {
  const auto body = test::json::parse(render_response(sample_turn()));
  EXPECT_EQ(body["object"], "response");
  EXPECT_EQ(body["status"], "completed");
  ASSERT_EQ(body["output"].size(), 3u);
  EXPECT_EQ(body["output"][0]["type"], "reasoning");
  EXPECT_EQ(body["output"][0]["content"][0]["text"], "think");
  EXPECT_EQ(body["output"][0]["encrypted_content"], "think");
  EXPECT_EQ(body["output"][1]["type"], "message");
  EXPECT_EQ(body["output"][1]["content"][0]["text"], "Checking.");
  EXPECT_EQ(body["output"][2]["type"], "function_call");
  EXPECT_EQ(body["output"][2]["call_id"], "call_a");
  EXPECT_EQ(body["usage"]["input_tokens_details"]["cached_tokens"], 12);
  Completion cut = sample_turn();
  cut.finish = FinishKind::kLength;
  EXPECT_EQ(test::json::parse(render_response(cut))["incomplete_details"]["reason"], "max_output_tokens");
}

TEST(ResponsesSchema, ResponseEchoesTheRequestSettings) {
  // The fields deepseek-recipe 0.2.0's ResponsesChunkGenerator.with_echo(request.echo()) reports.
  ChatRequest r;
  ASSERT_FALSE(parse_responses_request(body_of(R"({"input": "x", "instructions": "Be brief", "temperature": 0.3,
      "max_output_tokens": 99, "tool_choice": "auto",
      "tools": [{"type": "function", "name": "f", "description": "D", "parameters": {"type": "object"}}]})"), &r));
  Completion turn = sample_turn();
  turn.responses_echo = r.responses_echo;
  const auto body = test::json::parse(render_response(turn));
  EXPECT_EQ(body["tools"], test::json::parse(R"([{"type": "function", "name": "f", "description": "D",
      "parameters": {"type": "object"}, "strict": null}])"));
  EXPECT_EQ(body["instructions"], "Be brief");
  EXPECT_EQ(body["max_output_tokens"], 99);
  EXPECT_DOUBLE_EQ(body["temperature"].get<double>(), 0.3);
  EXPECT_EQ(body["top_p"], 1.0);
  EXPECT_EQ(body["tool_choice"], "auto");
  EXPECT_EQ(body["text"]["format"]["type"], "text");
}

TEST(ResponsesSchema, StreamEventsAreOrderedAndNumbered) {
  ResponsesStream s;
  const Completion c = sample_turn();
  s.on_start(c);
  s.on_reasoning("th");
  s.on_reasoning("ink");
  s.on_content("Checking.", {});
  s.on_tool_call(0, c.tool_calls[0]);
  s.on_finish(c);
  const auto events = test::parse_sse(s.take());
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto data = test::json::parse(events[i].data);
    EXPECT_EQ(data["type"], events[i].event);
    EXPECT_EQ(data["sequence_number"], i);
    types.push_back(events[i].event);
  }
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done",
      "response.completed"};
  EXPECT_EQ(types, expected);
  const auto done = test::json::parse(events.back().data)["response"];
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "think");
  // Item ids agree between the added / done events and the final response.
  EXPECT_EQ(test::json::parse(events[2].data)["item"]["id"], done["output"][0]["id"]);
}

// ---- Anthropic Messages.

TEST(AnthropicSchema, ParsesBlocksToolUseAndResults) {
  ChatRequest r;
  const SchemaError e = parse_messages_request(body_of(R"({
    "model": "m", "max_tokens": 100, "system": [{"type": "text", "text": "Be brief."}],
    "thinking": {"type": "enabled", "budget_tokens": 2048}, "output_config": {"effort": "max"},
    "stop_sequences": ["STOP"],
    "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
    "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "need tool", "signature": "sig"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "rain"}]},
        {"type": "text", "text": "And tomorrow?"}]}]})"),
                                               &r);
  ASSERT_FALSE(e.has_value()) << e->message;
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, Role::kSystem);
  EXPECT_EQ(r.messages[2].reasoning, "need tool");
  EXPECT_EQ(r.messages[2].content, "Checking.");
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(r.messages[3].role, Role::kTool);
  EXPECT_EQ(r.messages[3].tool_call_id, "toolu_1");
  EXPECT_EQ(r.messages[3].content, "rain");
  EXPECT_EQ(r.messages[4].role, Role::kUser);
  EXPECT_EQ(r.messages[4].content, "And tomorrow?");
  EXPECT_EQ(to_wire(r.tools[0]), R"({"name":"get_weather","description":"w","parameters":{"type":"object"}})");
  EXPECT_EQ(r.reasoning.thinking, true);
  EXPECT_EQ(r.reasoning.effort, 100);
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"STOP"});
}

TEST(AnthropicSchema, Rejections) {
  ChatRequest r;
  // max_tokens may be left out (deepseek-recipe 0.2.0 converts such a request; the default budget applies).
  EXPECT_FALSE(parse_messages_request(body_of(R"({"messages": [{"role": "user", "content": "x"}]})"), &r));
  EXPECT_FALSE(parse_messages_request(body_of(R"({"messages": [{"role": "user", "content": "x"}]})"), &r, true));
  EXPECT_EQ(parse_messages_request(
                body_of(R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})"), &r)
                ->param,
            "messages[0].role");
  // An image block needs a base64 source (the server fetches nothing); other block types are refused.
  EXPECT_EQ(parse_messages_request(body_of(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})"), &r)
                ->param,
            "messages[0].content[0].source.type");
  EXPECT_EQ(parse_messages_request(body_of(R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]})"), &r)
                ->param,
            "messages[0].content[0].type");
  EXPECT_EQ(parse_messages_request(body_of(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "bash_20250124", "name": "bash"}]})"), &r)
                ->param,
            "tools[0].type");
  EXPECT_EQ(parse_messages_request(body_of(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool", "name": "nope"}})"), &r)
                ->param,
            "tool_choice.name");
  EXPECT_EQ(parse_messages_request(body_of(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "sometimes"}})"), &r)
                ->param,
            "tool_choice.type");
}

// Tool names must match ^[a-zA-Z0-9_-]{1,64}$ (OpenAI's and Anthropic's rule; deepseek-recipe refuses
// anything outside [a-zA-Z0-9_-]+): a name with a quote would not read back from the DSML call, whose
// name="..." ends at the first quote. Every API answers a 400 naming the tool's field and the rule.
TEST(ToolNames, EveryApiRefusesNamesOutsideTheRule) {
  const std::string longest(64, 'a');
  const std::vector<std::string> good = {"get_weather", "a", "Get-Weather_2", "1abc", longest};
  const std::vector<std::string> bad = {"get\"weather", "", "get weather", "get.weather", "get/x", "x\ny",
                                        "名前", "get<｜DSML｜>", longest + "a"};
  auto parse = [](int api, const std::string& name, std::string* param) -> std::optional<std::string> {
    OrderedJson body;
    body["messages"] = OrderedJson::array({{{"role", "user"}, {"content", "x"}}});
    ChatRequest r;
    SchemaError e;
    if (api == 0) {
      body["tools"] = OrderedJson::array({{{"type", "function"}, {"function", {{"name", name}}}}});
      e = parse_chat_completion_request(body, &r);
    } else if (api == 1) {
      body["input"] = "x";
      body.erase("messages");
      body["tools"] = OrderedJson::array({{{"type", "function"}, {"name", name}}});
      e = parse_responses_request(body, &r);
    } else {
      body["max_tokens"] = 5;
      body["tools"] = OrderedJson::array({{{"name", name}, {"input_schema", {{"type", "object"}}}}});
      e = parse_messages_request(body, &r);
    }
    if (!e) return std::nullopt;
    EXPECT_EQ(e->http_status(), 400);
    *param = e->param;
    return e->message;
  };
  const char* fields[] = {"tools[0].function.name", "tools[0].name", "tools[0].name"};
  for (int api = 0; api < 3; ++api) {
    std::string param;
    for (const std::string& name : good) EXPECT_FALSE(parse(api, name, &param).has_value()) << api << " " << name;
    for (const std::string& name : bad) {
      const std::optional<std::string> message = parse(api, name, &param);
      ASSERT_TRUE(message.has_value()) << api << " accepted " << name;
      EXPECT_EQ(param, fields[api]) << *message;
      EXPECT_NE(message->find("^[a-zA-Z0-9_-]{1,64}$"), std::string::npos) << *message;
      EXPECT_NE(message->find(fields[api]), std::string::npos) << *message;
    }
    // The refused name is shown escaped, so the message stays one line.
    ASSERT_TRUE(parse(api, "get\"weather", &param).has_value());
    EXPECT_NE(parse(api, "get\"weather", &param)->find(R"("get\"weather")"), std::string::npos);
    EXPECT_EQ(parse(api, "x\ny", &param)->find('\n'), std::string::npos);
  }
}

TEST(AnthropicSchema, RendersAMessage) {
  const auto body = test::json::parse(render_message(sample_turn()));
  EXPECT_EQ(body["type"], "message");
  EXPECT_EQ(body["stop_reason"], "tool_use");
  ASSERT_EQ(body["content"].size(), 3u);
  EXPECT_EQ(body["content"][0]["type"], "thinking");
  EXPECT_FALSE(body["content"][0]["signature"].get<std::string>().empty());
  EXPECT_EQ(body["content"][1]["text"], "Checking.");
  EXPECT_EQ(body["content"][2]["input"]["city"], "Paris");
  EXPECT_EQ(body["content"][2]["input"]["days"], 3);
  // Anthropic counts cache reads apart from input tokens.
  EXPECT_EQ(body["usage"]["input_tokens"], 8);
  EXPECT_EQ(body["usage"]["cache_read_input_tokens"], 12);
  EXPECT_EQ(body["usage"]["output_tokens"], 7);
  Completion stopped = sample_turn();
  stopped.tool_calls.clear();
  stopped.finish = FinishKind::kStop;
  stopped.matched_stop = "STOP";
  const auto s = test::json::parse(render_message(stopped));
  EXPECT_EQ(s["stop_reason"], "stop_sequence");
  EXPECT_EQ(s["stop_sequence"], "STOP");
  const auto err = test::json::parse(render_anthropic_error({ErrorKind::kRateLimited, "busy", ""}));
  EXPECT_EQ(err["type"], "error");
  EXPECT_EQ(err["error"]["type"], "rate_limit_error");
}

TEST(AnthropicSchema, StreamEvents) {
  MessagesStream s;
  const Completion c = sample_turn();
  s.on_start(c);
  s.on_reasoning("think");
  s.on_content("Checking.", {});
  s.on_tool_call(0, c.tool_calls[0]);
  s.on_finish(c);
  const auto events = test::parse_sse(s.take());
  std::vector<std::string> types;
  for (const auto& e : events) types.push_back(e.event);
  const std::vector<std::string> expected = {
      "message_start",       "ping",                "content_block_start", "content_block_delta",
      "content_block_delta", "content_block_stop",  "content_block_start", "content_block_delta",
      "content_block_stop",  "content_block_start", "content_block_delta", "content_block_stop",
      "message_delta",       "message_stop"};
  EXPECT_EQ(types, expected);
  EXPECT_EQ(test::json::parse(events[4].data)["delta"]["type"], "signature_delta");
  EXPECT_EQ(test::json::parse(events[9].data)["content_block"]["type"], "tool_use");
  EXPECT_EQ(test::json::parse(events[10].data)["delta"]["partial_json"], "{\"city\": \"Paris\", \"days\": 3}");
  const auto delta = test::json::parse(events[12].data);
  EXPECT_EQ(delta["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(delta["usage"]["cache_read_input_tokens"], 12);
}

}  // namespace
}  // namespace cedar::serve
