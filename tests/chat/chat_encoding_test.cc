// The V4.1 prompt encoder against the golden prompts the official encoding.py produced
// (tests/tokenizer/data/official/v41-encode-public.jsonl), plus hand-worked cases from spec §6.2/§6.3 and the
// official encoder's documented behaviour.
#include "chat/chat_encoding.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/python_json.h"
#include "../tokenizer/tokenizer_test_util.h"

namespace cedar::chat {
namespace {

using tokenizer::have_shared_file;
using tokenizer::kV3TokenizerFile;
using tokenizer::official_dir;
using tokenizer::read_test_file;
using tokenizer::shared_dir;
using tokenizer::TokenId;
using tokenizer::v3_tokenizer;
using tokenizer::v4_tokenizer;

using ojson = nlohmann::ordered_json;

ChatOptions options_from_case(const ojson& c) {
  ChatOptions o;
  o.thinking_mode = c["thinking_mode"] == "thinking" ? ThinkingMode::kThinking : ThinkingMode::kChat;
  o.drop_thinking = c.value("drop_thinking", true);
  o.reasoning_effort = c["reasoning_effort"];
  return o;
}

TEST(ChatEncoding, GoldenPromptsFromOfficialEncoder) {
  std::ifstream in(official_dir() + "/v41-encode-public.jsonl");
  ASSERT_TRUE(in);
  std::string line;
  int prompts = 0, errors = 0;
  while (std::getline(in, line)) {
    const ojson c = ojson::parse(line);
    const std::string name = c["name"].get<std::string>();
    auto r = encode_chat(c["messages"], options_from_case(c));
    if (c.contains("prompt")) {
      ASSERT_TRUE(r.ok()) << name << ": " << r.status().to_string();
      EXPECT_EQ(r->text, c["prompt"].get<std::string>()) << name;
      ++prompts;
    } else {
      ASSERT_FALSE(r.ok()) << name << " must be rejected";
      // The official message follows the exception type ("AssertionError: ...").
      std::string official = c["error"].get<std::string>();
      official = official.substr(official.find(": ") + 2);
      EXPECT_NE(r.status().message().find(official), std::string::npos)
          << name << ": got '" << r.status().message() << "', official '" << official << "'";
      ++errors;
    }
  }
  EXPECT_GE(prompts, 20);
  EXPECT_GE(errors, 3);
}

TEST(ChatEncoding, MidConversationSystemInThinkingModeOpensThinking) {
  // Spec §6.2: a later system message counts as the last user turn for the header and for
  // drop_thinking, so the earlier assistant loses its reasoning.
  const ojson messages = ojson::parse(R"([
    {"role": "user", "content": "Q"},
    {"role": "assistant", "content": "A", "reasoning_content": "R"},
    {"role": "system", "content": "Be brief."}])");
  ChatOptions o;
  o.thinking_mode = ThinkingMode::kThinking;
  o.reasoning_effort = 10;
  auto r = encode_chat(messages, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->text,
            "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 10 (range 1-100, the higher the value, the more "
            "thorough the reasoning)\n\n<｜User｜>Q<｜Assistant｜></think>A<｜end▁of▁sentence｜><｜System｜>Be "
            "brief.<｜Assistant｜><think>");
}

TEST(ChatEncoding, ConsecutiveUserTurnsAndToolResultsMerge) {
  const ojson messages = ojson::parse(R"([
    {"role": "user", "content": "a"},
    {"role": "user", "content": "b"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"id": "x", "type": "function", "function": {"name": "f", "arguments": {"k": [1, 2.5, null, true]}}}]},
    {"role": "tool", "tool_call_id": "x", "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]},
    {"role": "user", "content": "thanks"}])");
  auto r = encode_chat(messages, ChatOptions{});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->text,
            "<｜begin▁of▁sentence｜><｜User｜>a\n\nb<｜Assistant｜></think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke "
            "name=\"f\">\n<｜DSML｜ parameter name=\"k\" string=\"false\">[1, 2.5, null, true]</｜DSML｜ "
            "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜><｜User｜><tool_result>r1\n\nr2</"
            "tool_result>\n\nthanks<｜Assistant｜></think>");
}

TEST(ChatEncoding, ArgumentsThatAreNotAnObjectAreWrapped) {
  // encoding.py: arguments that do not decode to an object become {"arguments": <original>}.
  const ojson messages = ojson::parse(R"([
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": "not json"}},
      {"type": "function", "function": {"name": "g", "arguments": "\"{\\\"a\\\": \\\"x\\\"}\""}}]}])");
  auto r = encode_chat(messages, ChatOptions{});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_NE(r->text.find("<｜DSML｜ parameter name=\"arguments\" string=\"true\">not json</｜DSML｜ parameter>"),
            std::string::npos);
  // A double-encoded JSON string is decoded twice.
  EXPECT_NE(r->text.find("<｜DSML｜ parameter name=\"a\" string=\"true\">x</｜DSML｜ parameter>"), std::string::npos);
}

TEST(ChatEncoding, EffortIsValidatedEvenInChatMode) {
  ChatOptions o;
  o.reasoning_effort = "medium";
  auto r = encode_chat(ojson::parse(R"([{"role": "user", "content": "hi"}])"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  o.reasoning_effort = 50.0;  // a float is not an int (type(effort) is int)
  EXPECT_FALSE(encode_chat(ojson::parse(R"([{"role": "user", "content": "hi"}])"), o).ok());
  o.reasoning_effort = true;
  EXPECT_FALSE(encode_chat(ojson::parse(R"([{"role": "user", "content": "hi"}])"), o).ok());
}

TEST(ChatEncoding, ImagesBecomePlaceholders) {
  const ojson messages = ojson::parse(R"([{"role": "user", "content": [
      {"type": "text", "text": "what is"}, {"type": "image_url", "image_url": {"url": "file:///a.png"}}]}])");
  auto r = encode_chat(messages, ChatOptions{});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->text, "<｜begin▁of▁sentence｜><｜User｜>what is\n\n<｜deepseek_image｜><｜Assistant｜></think>");
  ASSERT_EQ(r->images.size(), 1u);
  EXPECT_EQ(r->images[0], "file:///a.png");
  // A literal placeholder in text is refused.
  EXPECT_FALSE(encode_chat(ojson::parse(R"([{"role": "user", "content": "<｜deepseek_image｜>"}])"), ChatOptions{}).ok());
}

TEST(ChatEncoding, UnknownRoleIsAnError) {
  auto r = encode_chat(ojson::parse(R"([{"role": "developer", "content": "x"}])"), ChatOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Unknown role: developer"), std::string::npos);
  EXPECT_FALSE(encode_chat(ojson::parse(R"({"role": "user"})"), ChatOptions{}).ok());
}

TEST(ChatEncodingV4, SystemWithoutMarkerAndMaxEffortParagraph) {
  // Spec §6.3: no <｜System｜>; Think Max puts a fixed paragraph at the very start.
  const ojson messages = ojson::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])");
  ChatOptions o;
  o.format = PromptFormat::kV4;
  auto chat = encode_chat(messages, o);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->text, "<｜begin▁of▁sentence｜>S<｜User｜>U<｜Assistant｜></think>");
  o.thinking_mode = ThinkingMode::kThinking;
  auto high = encode_chat(messages, o);
  ASSERT_TRUE(high.ok());
  EXPECT_EQ(high->text, "<｜begin▁of▁sentence｜>S<｜User｜>U<｜Assistant｜><think>");
  o.reasoning_effort = "max";
  auto max = encode_chat(messages, o);
  ASSERT_TRUE(max.ok());
  EXPECT_EQ(max->text.rfind("<｜begin▁of▁sentence｜>Reasoning Effort: Absolute maximum with no shortcuts permitted.\n", 0), 0u);
  EXPECT_NE(max->text.find("unchecked.\n\nS<｜User｜>U<｜Assistant｜><think>"), std::string::npos);
  o.reasoning_effort = 50;
  EXPECT_FALSE(encode_chat(messages, o).ok());
}

TEST(ChatEncodingV4, UnspacedDsmlAndDeveloperRole) {
  const ojson messages = ojson::parse(R"([
    {"role": "developer", "content": "D"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": "{\"q\": \"x\"}"}}]}])");
  ChatOptions o;
  o.format = PromptFormat::kV4;
  auto r = encode_chat(messages, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // The developer turn is followed by an assistant turn, so it gets the assistant header.
  EXPECT_EQ(r->text,
            "<｜begin▁of▁sentence｜><｜User｜>D<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke "
            "name=\"f\">\n<｜DSML｜parameter name=\"q\" string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜invoke>\n</"
            "｜DSML｜tool_calls><｜end▁of▁sentence｜>");
}

TEST(ChatEncoding, IdsNeedTheMarkersAsSingleTokens) {
  auto prompt = encode_chat(ojson::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])"),
                            ChatOptions{});
  ASSERT_TRUE(prompt.ok());
  // The V4 tokenizer (id 128799 is a placeholder there) has no <｜System｜> token: encoding V4.1
  // prompts with it must fail loudly, naming the marker.
  auto v4_ids = encode_chat_ids(v4_tokenizer(), *prompt, PromptFormat::kV41);
  ASSERT_FALSE(v4_ids.ok());
  EXPECT_EQ(v4_ids.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(v4_ids.status().message().find("<｜System｜>"), std::string::npos);
  // A chat prompt without a system turn uses only markers the V4 tokenizer has.
  auto chat = encode_chat(ojson::parse(R"([{"role": "user", "content": "U"}])"), ChatOptions{});
  ASSERT_TRUE(chat.ok());
  auto ids = encode_chat_ids(v4_tokenizer(), *chat, PromptFormat::kV41);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  // BOS, <｜User｜>, "U", <｜Assistant｜>, </think> (spec §6.1 ids).
  EXPECT_EQ(*ids, (std::vector<TokenId>{0, 128803, 55, 128804, 128822}));  // ASCII byte b is id b - 30
}

TEST(ChatEncoding, V3TokenizerLacksThinkEnd) {
  CEDAR_SKIP_WITHOUT_SHARED(kV3TokenizerFile);
  // The DeepSeek-V3 tokenizer has not even </think>: a prompt without a system turn still fails.
  auto chat = encode_chat(ojson::parse(R"([{"role": "user", "content": "U"}])"), ChatOptions{});
  ASSERT_TRUE(chat.ok());
  auto v3_ids = encode_chat_ids(v3_tokenizer(), *chat, PromptFormat::kV41);
  ASSERT_FALSE(v3_ids.ok());
  EXPECT_NE(v3_ids.status().message().find("</think>"), std::string::npos);
}

TEST(OfficialGoldens, CommittedCopiesMatchShared) {
  // data/official holds copies of ../shared/encoding's goldens; where ../shared exists they must
  // not have drifted apart.
  for (const char* name : {"v41-encode-public.jsonl", "v41-parse-public.jsonl"}) {
    const std::string rel = std::string("encoding/") + name;
    if (!have_shared_file(rel)) GTEST_SKIP() << "optional: ../shared/" << rel << " is not beside the repository";
    EXPECT_TRUE(read_test_file(official_dir() + "/" + name) == read_test_file(shared_dir() + "/" + rel)) << name;
  }
}

TEST(PythonJson, MatchesPythonJsonDumps) {
  // Expected strings are Python 3.11 json.dumps(..., ensure_ascii=False) outputs.
  EXPECT_EQ(python_json_dumps(ojson::parse(R"({"b": 1, "a": [1.0, 0.5, 1e-5, 1e16, 123456789012345678.0, -0.0]})")),
            R"({"b": 1, "a": [1.0, 0.5, 1e-05, 1e+16, 1.2345678901234568e+17, -0.0]})");
  EXPECT_EQ(python_json_dumps(ojson::parse(R"(["é\n\t\"\\\u0001\u007f", {}, [], null, true, false])")),
            "[\"é\\n\\t\\\"\\\\\\u0001\x7f\", {}, [], null, true, false]");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(3.14), "3.14");
  EXPECT_EQ(python_float_repr(1.5e-7), "1.5e-07");
  EXPECT_EQ(python_float_repr(2.5e300), "2.5e+300");
}

}  // namespace
}  // namespace cedar::chat
