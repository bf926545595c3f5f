// strict: true tools: the canonical schemas and refusals deepseek-recipe 0.2.0 gives (its outputs on
// these declarations were observed with ChatCompletionRequest(...).convert(); the corpus check in
// tests/serve/recipe compares the whole prompts when its venv is present).
#include <gtest/gtest.h>

#include "serve/api/openai_schema.h"
#include "serve/api/responses_schema.h"

namespace cedar::serve {
namespace {

OrderedJson chat_with(const char* tools) {
  return OrderedJson::parse(std::string(R"({"messages": [{"role": "user", "content": "x"}], "tools": )") + tools + "}");
}

TEST(StrictTools, SchemasTakeDeepseekRecipesCanonicalForm) {
  ChatRequest r;
  ASSERT_FALSE(parse_chat_completion_request(chat_with(R"([{"type": "function", "function": {"name": "f", "strict": true,
      "parameters": {"title": "T", "type": "object", "required": ["n", "b", "a"], "properties": {
        "b": {"description": "B", "type": "string", "minLength": 1, "enum": ["x"]},
        "a": {"type": "integer", "minimum": 0, "enum": [1], "format": "int32"},
        "n": {"type": "object", "properties": {"c": {"type": "array", "items": {"type": "boolean", "default": true}}}}},
      "description": "D", "$defs": {"q": {"type": "string"}}}}}])"), &r));
  ASSERT_EQ(r.tools.size(), 1u);
  // deepseek-recipe's output for this declaration: unknown keywords dropped, keys in its order,
  // required listing every property in property order, additionalProperties false on every object.
  const OrderedJson want = OrderedJson::parse(R"({"type": "object", "properties": {
      "b": {"type": "string", "description": "B", "enum": ["x"]},
      "a": {"type": "integer", "minimum": 0},
      "n": {"type": "object", "properties": {"c": {"type": "array", "items": {"type": "boolean"}}},
            "additionalProperties": false, "required": ["c"]}},
    "additionalProperties": false, "required": ["b", "a", "n"], "description": "D"})");
  EXPECT_EQ(r.tools[0]["parameters"].dump(), want.dump());
}

TEST(StrictTools, WithoutParametersAStrictToolTakesNoArguments) {
  ChatRequest r;
  ASSERT_FALSE(parse_responses_request(OrderedJson::parse(R"({"input": "x", "tools": [
      {"type": "function", "name": "f", "strict": true}]})"), &r));
  EXPECT_EQ(r.tools[0]["parameters"].dump(),
            R"({"type":"object","properties":{},"additionalProperties":false,"required":[]})");
}

TEST(StrictTools, RefusalsAre400) {
  const char* refused[] = {
      // strict and non-strict together
      R"([{"type": "function", "function": {"name": "f", "strict": true}}, {"type": "function", "function": {"name": "g"}}])",
      // a required list that is not every property
      R"([{"type": "function", "function": {"name": "f", "strict": true, "parameters": {"type": "object",
          "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "required": ["a"]}}}])",
      R"([{"type": "function", "function": {"name": "f", "strict": true, "parameters": {"type": "object",
          "properties": {}, "additionalProperties": true}}}])",
      R"([{"type": "function", "function": {"name": "f", "strict": true, "parameters": {"type": "object",
          "properties": {"a": {"type": "array"}}}}}])",
      R"([{"type": "function", "function": {"name": "f", "strict": true, "parameters": {"type": "object",
          "properties": {"a": {"description": "untyped"}}}}}])",
      R"([{"type": "function", "function": {"name": "f", "strict": true, "parameters": {"type": "object",
          "properties": {"a": {"type": "string", "format": "date"}}}}}])",
      R"([{"type": "function", "function": {"name": "f", "strict": true, "parameters": {"type": "object",
          "properties": {"a": {"type": "object", "properties": {}}}}}}])",
      R"([{"type": "function", "function": {"name": "f", "strict": true, "parameters": {"type": "string"}}}])",
  };
  for (const char* tools : refused) {
    ChatRequest r;
    const SchemaError e = parse_chat_completion_request(chat_with(tools), &r);
    ASSERT_TRUE(e.has_value()) << tools;
    EXPECT_EQ(e->http_status(), 400) << tools;
  }
}

TEST(StrictTools, NonStrictToolsAreShownAsSent) {
  ChatRequest r;
  ASSERT_FALSE(parse_chat_completion_request(chat_with(R"([{"type": "function", "function": {"name": "f", "strict": false,
      "parameters": {"type": "object", "properties": {"a": {"type": "string", "title": "A"}}}}}])"), &r));
  EXPECT_EQ(r.tools[0]["parameters"].dump(), R"({"type":"object","properties":{"a":{"type":"string","title":"A"}}})");
}

}  // namespace
}  // namespace cedar::serve
