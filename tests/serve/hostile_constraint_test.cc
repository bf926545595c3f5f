// Hostile output constraints through the real HTTP API (issue 35, points 1, 8 and 9): regexes and
// schemas that would make xgrammar allocate without bound or compile for minutes, keywords it does
// not enforce and schemas that accept nothing are each answered 400 in the API's own error format,
// naming the limit or keyword and the field, with no build paths or timestamps; the server stays up
// and its peak RSS is printed (not asserted). The constraint goes through the server's real
// GrammarEngine (built from the test tokenizer); the scripted engine writes the replies.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using test::json;

// Peak and current resident set of this process (the server runs in it), from /proc/self/status.
long status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(field, 0) == 0) return std::strtol(line.c_str() + std::string(field).size(), nullptr, 10);
  return -1;
}

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

// The three ways a response constraint arrives: Chat's response_format, Responses' text.format,
// Anthropic's output_config.format.
struct Api {
  const char* path;
  bool anthropic;
};
constexpr Api kChat{"/v1/chat/completions", false};
constexpr Api kResponses{"/v1/responses", false};
constexpr Api kMessages{"/v1/messages", true};

json schema_request(const Api& api, const json& schema) {
  if (api.path == kChat.path)
    return {{"model", "m"}, {"messages", {user("json")}},
            {"max_tokens", 16},
            {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", schema}}}}}};
  if (api.path == kResponses.path)
    return {{"model", "m"}, {"input", "json"}, {"max_output_tokens", 16}, {"text", {{"format", {{"type", "json_schema"}, {"name", "n"}, {"schema", schema}}}}}};
  return {{"model", "m"}, {"max_tokens", 16}, {"messages", {user("json")}},
          {"output_config", {{"format", {{"type", "json_schema"}, {"schema", schema}}}}}};
}

json tool_request(const Api& api, const json& parameters) {
  if (api.path == kChat.path)
    return {{"model", "m"}, {"messages", {user("call")}}, {"max_tokens", 16},
            {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", parameters}}}}}}};
  if (api.path == kResponses.path)
    return {{"model", "m"}, {"input", "call"}, {"max_output_tokens", 16},
            {"tools", {{{"type", "function"}, {"name", "f"}, {"parameters", parameters}}}}};
  return {{"model", "m"}, {"max_tokens", 16}, {"messages", {user("call")}},
          {"tools", {{{"name", "f"}, {"input_schema", parameters}}}}};
}

class HostileConstraintTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = test::make_engine({{"", "{\"a\": 1}" + std::string(test::kEos)}});
    server_ = std::make_unique<test::TestServer>(*engine_);
    client_ = server_->client(60);
  }

  // POSTs `body` and expects a 400 in the API's error shape whose message holds every one of `parts`
  // and no source path or timestamp.
  void expect_refused(const Api& api, const json& body, const std::vector<std::string>& parts) {
    int status = 0;
    const json reply = test::post_json(*client_, api.path, body, &status);
    EXPECT_EQ(status, 400) << api.path << " " << body.dump().substr(0, 300) << "\n" << reply.dump();
    if (api.anthropic) EXPECT_EQ(reply.value("type", ""), "error") << reply.dump();
    ASSERT_TRUE(reply.contains("error") && reply["error"].is_object()) << reply.dump();
    EXPECT_EQ(reply["error"].value("type", ""), "invalid_request_error") << reply.dump();
    const std::string message = reply["error"].value("message", "");
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    EXPECT_EQ(message.find(".cc:"), std::string::npos) << message;
    EXPECT_FALSE(std::regex_search(message, std::regex(R"(\[\d\d:\d\d:\d\d\])"))) << message;  // xgrammar's "[hh:mm:ss]"
  }

  void expect_alive() {
    auto health = client_->Get("/health");
    ASSERT_TRUE(health) << "the server is gone";
    EXPECT_EQ(health->status, 200);
  }

  std::unique_ptr<ScriptedEngine> engine_;
  std::unique_ptr<test::TestServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HostileConstraintTest, HugeRepetitionsAreRefusedBeforeCompiling) {
  const long hwm_before = status_kib("VmHWM:");
  const json regex_body = {{"messages", {user("x")}}, {"response_format", {{"type", "regex"}, {"regex", "a{99999999999}"}}}};
  expect_refused(kChat, regex_body,
                 {"regex repetition bound 99999999999 exceeds the limit of 1000 (response_format.regex)"});
  expect_refused(kChat, {{"messages", {user("x")}}, {"response_format", {{"type", "regex"}, {"regex", "a{10000000}"}}}},
                 {"bound 10000000 exceeds the limit of 1000"});
  expect_refused(kChat, {{"messages", {user("x")}}, {"response_format", {{"type", "regex"}, {"regex", "(a{1000}){1000}"}}}},
                 {"nested repetition product 1000000 exceeds the limit of 10000"});
  // Cheap to compile but 240 ms per token to match (the copies split the text many ways).
  expect_refused(kChat, {{"messages", {user("x")}}, {"response_format", {{"type", "regex"}, {"regex", "([a-z ]{0,10}){0,10}"}}}},
                 {"counted repetitions over a variable-length part 100 exceeds the limit of 8"});
  const json pattern = {{"type", "object"},
                        {"properties", {{"a", {{"type", "string"}, {"pattern", "a{99999999999}"}}}}},
                        {"required", {"a"}}};
  expect_refused(kChat, schema_request(kChat, pattern),
                 {"bound 99999999999", "response_format.json_schema.schema, at #/properties/a/pattern"});
  expect_refused(kResponses, schema_request(kResponses, pattern), {"bound 99999999999", "text.format.schema"});
  expect_refused(kMessages, schema_request(kMessages, pattern), {"bound 99999999999", "output_config.format.schema"});
  const json pattern_properties = {{"type", "object"}, {"patternProperties", {{"^(k{1000}){1000}$", {{"type", "integer"}}}}}};
  expect_refused(kChat, schema_request(kChat, pattern_properties), {"nested repetition product", "patternProperties"});
  const json long_string = {{"type", "object"}, {"properties", {{"s", {{"type", "string"}, {"maxLength", 99999999}}}}}};
  expect_refused(kResponses, schema_request(kResponses, long_string), {"'maxLength' 99999999 exceeds the limit of 10000"});
  for (const Api& api : {kChat, kResponses, kMessages})
    expect_refused(api, tool_request(api, pattern), {"bound 99999999999", "tools[0] 'f' parameters, at #/properties/a/pattern"});
  expect_alive();
  const long hwm_after = status_kib("VmHWM:");
  std::printf("[ hostile  ] peak RSS (VmHWM) before %ld KiB, after the hostile repetitions %ld KiB\n", hwm_before, hwm_after);
}

TEST_F(HostileConstraintTest, UnenforcedKeywordsAreRefusedByName) {
  const char* cases[][2] = {
      {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "not": {"required": ["a"]}})", "'not'"},
      {R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]})", "'allOf'"},
      {R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "'oneOf'"},
      {R"({"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}})", "'contains'"},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
          "if": {"required": ["a"]}, "then": {"required": ["b"]}})", "'if'"},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
          "dependentRequired": {"a": ["b"]}})", "'dependentRequired'"},
      {R"({"type": "array", "items": {"type": "integer"}, "uniqueItems": true})", "'uniqueItems'"},
  };
  for (const auto& c : cases) {
    const json schema = json::parse(c[0]);
    expect_refused(kChat, schema_request(kChat, schema), {std::string("JSON Schema keyword ") + c[1] + " is not enforced"});
    expect_refused(kMessages, schema_request(kMessages, schema), {std::string("JSON Schema keyword ") + c[1]});
    expect_refused(kResponses, tool_request(kResponses, schema), {std::string("JSON Schema keyword ") + c[1], "tools"});
  }
  expect_alive();
}

TEST_F(HostileConstraintTest, SchemasThatAcceptNothingAre400) {
  const char* cases[][2] = {
      {R"({"anyOf": [{"$ref": "#"}]})", "the schema accepts no value"},
      {R"({"type": []})", "'type' is an empty array"},
      {R"({"type": "object", "properties": {"a": {"enum": []}}})", "'enum' is empty"},
      {R"({"type": "object", "properties": {"a": false}})", "the schema `false` accepts no value"},
      {R"({"type": "object", "properties": {"a": {"type": "string", "enum": [1, 2]}}})", "does not match 'type'"},
  };
  for (const auto& c : cases) {
    for (const Api& api : {kChat, kResponses, kMessages})
      expect_refused(api, schema_request(api, json::parse(c[0])), {c[1]});
    expect_refused(kChat, tool_request(kChat, json::parse(c[0])), {c[1]});
  }
  expect_alive();
}

TEST_F(HostileConstraintTest, GrammarLibraryErrorsCarryNoPathsOrTimes) {
  // Errors only xgrammar finds (bad syntax) reach the client as its reason alone.
  expect_refused(kChat, {{"messages", {user("x")}}, {"response_format", {{"type", "regex"}, {"regex", "(ab"}}}},
                 {"cannot be enforced", "parenthesis is not closed"});
  expect_refused(kChat, schema_request(kChat, json::parse(R"({"type": "object", "properties": {"a": {"type": "strng"}}})")),
                 {"cannot be enforced", "strng"});
  expect_alive();
}

TEST_F(HostileConstraintTest, OrdinaryConstraintsStillRun) {
  int status = 0;
  const json schema = json::parse(R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0},
      "note": {"type": "string", "maxLength": 200, "description": "free text"}}, "required": ["a"], "title": "T"})");
  for (const Api& api : {kChat, kResponses, kMessages}) {
    const json reply = test::post_json(*client_, api.path, schema_request(api, schema), &status);
    EXPECT_EQ(status, 200) << api.path << ": " << reply.dump();
  }
  const json reply = test::post_json(
      *client_, kChat.path,
      {{"messages", {user("x")}}, {"max_tokens", 16}, {"response_format", {{"type", "regex"}, {"regex", R"(\{"a": \d{1,3}\})"}}}},
      &status);
  EXPECT_EQ(status, 200) << reply.dump();
}

}  // namespace
}  // namespace cedar::serve
