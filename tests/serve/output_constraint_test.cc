// The request side of constrained decoding (serve/output_constraint.h): tool_choice and response
// formats in the three APIs become the constraint deepseek-recipe 0.2.0 derives
// (InferenceOptions.output_constraint; the expected kinds below are what it returns for the same
// bodies), and the strict json_schema rules it enforces.
#include "serve/api/output_constraint.h"

#include <gtest/gtest.h>

#include "serve/api/anthropic_schema.h"
#include "serve/api/openai_schema.h"
#include "serve/api/responses_schema.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using constrain::ConstraintKind;

OrderedJson body_of(const char* text) { return OrderedJson::parse(text); }

constexpr const char* kChatTools =
    R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "f2"}}])";

ChatRequest chat(const std::string& extra) {
  ChatRequest r;
  const std::string body = R"({"messages": [{"role": "user", "content": "json please"}], "tools": )" +
                           std::string(kChatTools) + extra + "}";
  const SchemaError e = parse_chat_completion_request(body_of(body.c_str()), &r);
  EXPECT_FALSE(e.has_value()) << body << ": " << (e ? e->message : "");
  return r;
}

TEST(OutputConstraint, ChatToolChoices) {
  auto spec = output_constraint(chat(""), false);
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->kind, ConstraintKind::kToolCall);
  const ChatRequest required = chat(R"(, "tool_choice": "required")");
  EXPECT_TRUE(required.tool_call_required);
  EXPECT_EQ(required.tools.size(), 2u);
  EXPECT_EQ(output_constraint(required, false)->kind, ConstraintKind::kToolCallRequired);
  const ChatRequest named = chat(R"(, "tool_choice": {"type": "function", "function": {"name": "f2"}})");
  ASSERT_EQ(named.tools.size(), 1u);
  EXPECT_EQ(named.tools[0]["name"], "f2");
  spec = output_constraint(named, false);
  EXPECT_EQ(spec->kind, ConstraintKind::kToolCallRequired);
  EXPECT_EQ(test::json::parse(spec->text), test::json::parse(R"([{"name": "f2"}])"));
  const ChatRequest none = chat(R"(, "tool_choice": "none", "response_format": {"type": "json_object"})");
  EXPECT_TRUE(none.tools.empty());
  spec = output_constraint(none, true);
  EXPECT_EQ(spec->kind, ConstraintKind::kJson);
  EXPECT_EQ(spec->text, "");
  EXPECT_TRUE(spec->after_think_end);
  // Tools win over a response format.
  EXPECT_EQ(output_constraint(chat(R"(, "response_format": {"type": "json_object"})"), false)->kind,
            ConstraintKind::kToolCall);
}

TEST(OutputConstraint, ChatRefusesUnknownNamesAndShapes) {
  ChatRequest r;
  SchemaError e = parse_chat_completion_request(
      body_of(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a"}}],
                  "tool_choice": {"type": "function", "function": {"name": "b"}}})"),
      &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "tool_choice.function.name");
  ChatRequest r2;
  e = parse_chat_completion_request(
      body_of(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a"}}],
                  "tool_choice": "sometimes"})"),
      &r2);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "tool_choice");
}

TEST(OutputConstraint, RegexAndJsonSchemaFormats) {
  ChatRequest r;
  ASSERT_FALSE(parse_chat_completion_request(
      body_of(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "regex", "regex": "[a-z]+"}})"), &r));
  EXPECT_FALSE(r.response_format) << "a regex adds nothing to the prompt";
  auto spec = output_constraint(r, false);
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->kind, ConstraintKind::kRegex);
  EXPECT_EQ(spec->text, "[a-z]+");
  ChatRequest loose;
  ASSERT_FALSE(parse_chat_completion_request(body_of(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}})"),
                                             &loose));
  spec = output_constraint(loose, false);
  EXPECT_FALSE(spec->strict);
  EXPECT_EQ(test::json::parse(spec->text), test::json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}})"));
}

TEST(OutputConstraint, StrictSchemaIsRewrittenAsDeepseekRecipeDoes) {
  // deepseek-recipe's constraint for this strict schema (nested objects get the same treatment).
  ChatRequest r;
  ASSERT_FALSE(parse_chat_completion_request(body_of(R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "s", "strict": true, "schema":
        {"type": "object", "properties": {"a": {"type": "integer"}, "o": {"type": "object", "properties": {"b": {"type": "string"}}}}}}}})"),
                                             &r));
  const auto spec = output_constraint(r, false);
  EXPECT_TRUE(spec->strict);
  EXPECT_EQ(test::json::parse(spec->text), test::json::parse(R"({"type": "object",
      "properties": {"a": {"type": "integer"}, "o": {"type": "object", "properties": {"b": {"type": "string"}},
                     "additionalProperties": false, "required": ["b"]}},
      "additionalProperties": false, "required": ["a", "o"]})"));
  EXPECT_EQ(r.response_format->dump(), R"({"type":"object","properties":{"a":{"type":"integer"},"o":{"type":"object","properties":{"b":{"type":"string"}}}}})")
      << "the prompt shows the schema as sent";
}

TEST(OutputConstraint, StrictSchemaRules) {
  for (const char* schema : {R"({"type": "object"})", R"({"type": "array", "items": {"type": "string"}})",
                             R"({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "required": ["a"]})",
                             R"({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true})",
                             R"({"type": "object", "properties": {"e": {"enum": ["x"]}}})"}) {
    ChatRequest r;
    const std::string body = std::string(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "s", "strict": true, "schema": )") +
                             schema + "}}}";
    const SchemaError e = parse_chat_completion_request(body_of(body.c_str()), &r);
    ASSERT_TRUE(e) << schema;
    EXPECT_EQ(e->param, "response_format.json_schema.schema") << schema;
  }
}

TEST(OutputConstraint, ResponsesToolChoiceAndTextFormat) {
  ChatRequest r;
  ASSERT_FALSE(parse_responses_request(body_of(R"({"input": "x", "tools": [{"type": "function", "name": "a"}, {"type": "function", "name": "b"}],
      "tool_choice": {"type": "function", "name": "b"}})"), &r));
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(output_constraint(r, false)->kind, ConstraintKind::kToolCallRequired);
  ChatRequest strict;
  ASSERT_FALSE(parse_responses_request(body_of(R"({"input": "json", "text": {"format": {"type": "json_schema", "name": "s", "strict": true,
      "schema": {"type": "object", "properties": {"a": {"type": "boolean"}}}}}})"), &strict));
  EXPECT_TRUE(output_constraint(strict, false)->strict);
  ChatRequest regex;
  EXPECT_TRUE(parse_responses_request(body_of(R"({"input": "x", "text": {"format": {"type": "regex", "pattern": "a"}}})"), &regex));
}

TEST(OutputConstraint, MessagesToolChoice) {
  const char* tools = R"("tools": [{"name": "a", "input_schema": {"type": "object"}}, {"name": "b", "input_schema": {"type": "object"}}])";
  ChatRequest any, tool;
  ASSERT_FALSE(parse_messages_request(
      body_of((std::string(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], )") + tools +
               R"(, "tool_choice": {"type": "any"}})").c_str()),
      &any));
  EXPECT_EQ(output_constraint(any, false)->kind, ConstraintKind::kToolCall) << "deepseek-recipe: any is tool_call";
  ASSERT_FALSE(parse_messages_request(
      body_of((std::string(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], )") + tools +
               R"(, "tool_choice": {"type": "tool", "name": "a"}})").c_str()),
      &tool));
  EXPECT_EQ(output_constraint(tool, false)->kind, ConstraintKind::kToolCallRequired);
  ASSERT_EQ(tool.tools.size(), 1u);
}

}  // namespace
}  // namespace cedar::serve
