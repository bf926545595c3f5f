// Log-probabilities over HTTP, from the scripted engine's synthetic distribution
// (scripted_logprob / scripted_alternative): Chat Completions (plain and streamed), legacy
// Completions and Responses report exactly the content tokens, in OpenAI's shapes; reasoning,
// DSML markup and tool call tokens are left out.
#include <gtest/gtest.h>

#include <cstdio>

#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using test::json;
using test::post_json;

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

// The bytes of a token as the byte-level test tokenizer writes them.
std::string bytes_of(int32_t id) { return std::string(test::test_tokenizer().token_bytes(id)); }

json byte_array(const std::string& bytes) {
  json out = json::array();
  for (unsigned char c : bytes) out.push_back(static_cast<int>(c));
  return out;
}

// OpenAI's spelling of a token that is not whole UTF-8 characters.
std::string spelled(const std::string& bytes) {
  if (bytes.size() == 1 && static_cast<unsigned char>(bytes[0]) >= 0x80) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "bytes:\\x%02x", static_cast<unsigned char>(bytes[0]));
    return buf;
  }
  return bytes;
}

// What the scripted engine reports for `text`'s tokens played from output position `first`
// onwards, with k alternatives: logprob -0.25 * (position % 4); alternatives id + j, logprob - j.
json expected_entries(const std::string& text, size_t first, int k, bool with_bytes = true) {
  json out = json::array();
  const int vocab = test::test_tokenizer().vocab_size();
  size_t position = first;
  for (int32_t id : test::ids_of(text)) {
    const double lp = -0.25 * static_cast<double>(position % 4);
    json entry = {{"token", spelled(bytes_of(id))}, {"logprob", lp}};
    if (with_bytes) entry["bytes"] = byte_array(bytes_of(id));
    json top = json::array();
    for (int j = 0; j < k; ++j) {
      const int32_t alt = (id + j) % vocab;
      json choice = {{"token", spelled(bytes_of(alt))}, {"logprob", lp - j}};
      if (with_bytes) choice["bytes"] = byte_array(bytes_of(alt));
      top.push_back(choice);
    }
    entry["top_logprobs"] = top;
    out.push_back(entry);
    ++position;
  }
  return out;
}

std::vector<test::SseEvent> stream_events(httplib::Client& client, const std::string& path, json body) {
  body["stream"] = true;
  auto res = client.Post(path, body.dump(), "application/json");
  if (!res) {
    ADD_FAILURE() << "no response";
    return {};
  }
  EXPECT_EQ(res->status, 200) << res->body;
  return test::parse_sse(res->body);
}

class LogprobsTest : public ::testing::Test {
 protected:
  void start(const std::string& completion) {
    engine_ = test::make_engine({{"", completion}});
    server_ = std::make_unique<test::TestServer>(*engine_);
    client_ = server_->client();
  }
  std::unique_ptr<ScriptedEngine> engine_;
  std::unique_ptr<test::TestServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(LogprobsTest, ChatReportsContentTokensNotReasoning) {
  // Thinking mode: "hm" (positions 0, 1) and </think> (2) are reasoning; "Rain." starts at 3.
  start("hm</think>Rain." + std::string(test::kEos));
  const json body = {{"messages", {user("weather?")}}, {"reasoning_effort", "high"}, {"logprobs", true},
                     {"top_logprobs", 2}};
  const json r = post_json(*client_, "/v1/chat/completions", body);
  ASSERT_EQ(r["choices"][0]["message"]["content"], "Rain.") << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "hm");
  EXPECT_EQ(r["choices"][0]["logprobs"]["content"], expected_entries("Rain.", 3, 2));
  EXPECT_TRUE(r["choices"][0]["logprobs"]["refusal"].is_null());

  // Streamed: the chunks' entries, concatenated, are the same list, each with its content delta.
  json streamed = json::array();
  for (const auto& e : stream_events(*client_, "/v1/chat/completions", body)) {
    if (e.data == "[DONE]") continue;
    const json chunk = json::parse(e.data);
    const json& choice = chunk["choices"][0];
    if (choice["delta"].contains("content") && !choice["delta"]["content"].get<std::string>().empty()) {
      for (const json& entry : choice["logprobs"]["content"]) streamed.push_back(entry);
    } else {
      EXPECT_TRUE(choice["logprobs"].is_null()) << e.data;
    }
  }
  EXPECT_EQ(streamed, expected_entries("Rain.", 3, 2));
}

TEST_F(LogprobsTest, WithoutTheRequestThereAreNoneAndBadValuesAre400) {
  start("Rain." + std::string(test::kEos));
  const json plain = post_json(*client_, "/v1/chat/completions", {{"messages", {user("hi")}}});
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
  const json no_top = post_json(*client_, "/v1/chat/completions", {{"messages", {user("hi")}}, {"logprobs", true}});
  EXPECT_EQ(no_top["choices"][0]["logprobs"]["content"], expected_entries("Rain.", 0, 0));
  int status = 0;
  json e = post_json(*client_, "/v1/chat/completions", {{"messages", {user("hi")}}, {"top_logprobs", 2}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["param"], "top_logprobs");
  e = post_json(*client_, "/v1/chat/completions",
                {{"messages", {user("hi")}}, {"logprobs", true}, {"top_logprobs", 21}}, &status);
  EXPECT_EQ(status, 400);
  e = post_json(*client_, "/v1/completions", {{"prompt", "x"}, {"logprobs", -1}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["param"], "logprobs");
}

TEST_F(LogprobsTest, PartialUtf8TokensAreSpelledAsBytes) {
  start("\xC3\xA9t\xC3\xA9" + std::string(test::kEos));  // "été": 5 byte tokens
  const json r = post_json(*client_, "/v1/chat/completions",
                           {{"messages", {user("hi")}}, {"logprobs", true}, {"top_logprobs", 1}});
  const json& content = r["choices"][0]["logprobs"]["content"];
  EXPECT_EQ(content, expected_entries("\xC3\xA9t\xC3\xA9", 0, 1));
  ASSERT_EQ(content.size(), 5u);
  EXPECT_EQ(content[0]["token"], "bytes:\\xc3");
  EXPECT_EQ(content[0]["bytes"], json::array({0xC3}));
}

TEST_F(LogprobsTest, ToolCallTokensAndStopStringsAreLeftOut) {
  start("Checking.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"
        "<｜DSML｜ parameter name=\"a\" string=\"true\">x</｜DSML｜ parameter>\n"
        "</｜DSML｜ invoke>\n</｜DSML｜ calls>" + std::string(test::kEos));
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  const json r = post_json(*client_, "/v1/chat/completions",
                           {{"messages", {user("go")}}, {"tools", tools}, {"logprobs", true}});
  ASSERT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
  const std::string content = r["choices"][0]["message"]["content"];
  EXPECT_EQ(r["choices"][0]["logprobs"]["content"], expected_entries(content, 0, 0));
  // A stop string: the tokens it covers are not content.
  const json stopped = post_json(*client_, "/v1/chat/completions",
                                 {{"messages", {user("go")}}, {"stop", {"ki"}}, {"logprobs", true}});
  EXPECT_EQ(stopped["choices"][0]["message"]["content"], "Chec");
  EXPECT_EQ(stopped["choices"][0]["logprobs"]["content"], expected_entries("Chec", 0, 0));
}

TEST_F(LogprobsTest, JsonOutputSpacesCarryTheTokensTheyStandFor) {
  // json_object: the text around the JSON comes back as one space per token, each with that token's
  // entry (as deepseek-recipe reports them); the fence tokens (positions 4-11, 19-22) are left out.
  start("Ok:\n```json\n{\"a\":1}\n```\nBye" + std::string(test::kEos));
  const json r = post_json(*client_, "/v1/chat/completions",
                           {{"messages", {user("in json")}}, {"response_format", {{"type", "json_object"}}},
                            {"logprobs", true}});
  ASSERT_EQ(r["choices"][0]["message"]["content"], "    {\"a\":1}    ") << r.dump();
  json expected = expected_entries("Ok:\n", 0, 0);
  for (const json& e : expected_entries("{\"a\":1}", 12, 0)) expected.push_back(e);
  for (const json& e : expected_entries("\nBye", 23, 0)) expected.push_back(e);
  EXPECT_EQ(r["choices"][0]["logprobs"]["content"], expected);
}

TEST_F(LogprobsTest, LegacyCompletionsGiveTokensOffsetsAndTopMaps) {
  start(" up" + std::string(test::kEos));
  const json r = post_json(*client_, "/v1/completions", {{"prompt", "Once"}, {"logprobs", 2}});
  const json& lp = r["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json::array({" ", "u", "p"}));
  EXPECT_EQ(lp["token_logprobs"], json::array({0.0, -0.25, -0.5}));
  EXPECT_EQ(lp["text_offset"], json::array({0, 1, 2}));
  const int32_t u = test::ids_of("u")[0];
  const json top_u = {{bytes_of(u), -0.25}, {bytes_of(u + 1), -1.25}};
  EXPECT_EQ(lp["top_logprobs"][1], top_u);
  // Streamed: each chunk carries its tokens; offsets count from the start of the text.
  json tokens = json::array(), offsets = json::array();
  for (const auto& e : stream_events(*client_, "/v1/completions", {{"prompt", "Once"}, {"logprobs", 0}})) {
    if (e.data == "[DONE]") continue;
    const json chunk = json::parse(e.data);
    const json& choice = chunk["choices"][0];
    if (choice["logprobs"].is_null()) continue;
    for (const json& t : choice["logprobs"]["tokens"]) tokens.push_back(t);
    for (const json& o : choice["logprobs"]["text_offset"]) offsets.push_back(o);
  }
  EXPECT_EQ(tokens, json::array({" ", "u", "p"}));
  EXPECT_EQ(offsets, json::array({0, 1, 2}));
}

TEST_F(LogprobsTest, ResponsesNeedTheIncludeAndCarryThemOnOutputText) {
  start("Rain." + std::string(test::kEos));
  const json plain = post_json(*client_, "/v1/responses", {{"input", "hi"}, {"top_logprobs", 1}});
  EXPECT_EQ(plain["output"][0]["content"][0]["logprobs"], json::array()) << "no include: no logprobs";
  const json body = {{"input", "hi"}, {"top_logprobs", 1}, {"include", {"message.output_text.logprobs"}}};
  const json r = post_json(*client_, "/v1/responses", body);
  EXPECT_EQ(r["output"][0]["content"][0]["logprobs"], expected_entries("Rain.", 0, 1));
  json deltas = json::array();
  json done;
  for (const auto& e : stream_events(*client_, "/v1/responses", body)) {
    const json event = json::parse(e.data);
    if (event["type"] == "response.output_text.delta")
      for (const json& entry : event["logprobs"]) deltas.push_back(entry);
    if (event["type"] == "response.output_text.done") done = event["logprobs"];
    if (event["type"] == "response.completed") {
      EXPECT_EQ(event["response"]["output"][0]["content"][0]["logprobs"], expected_entries("Rain.", 0, 1));
    }
  }
  EXPECT_EQ(deltas, expected_entries("Rain.", 0, 1, /*with_bytes=*/false));
  EXPECT_EQ(done, expected_entries("Rain.", 0, 1, /*with_bytes=*/false));
}

}  // namespace
}  // namespace cedar::serve
