// The streaming completion parser against the official parser's results on the golden
// completions (tests/tokenizer/data/official/v41-parse-public.jsonl), fed whole, byte by byte, in random
// pieces and token by token; plus hand-worked cases for what streaming adds.
#include "tokenizer/completion_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace cedar::tokenizer {
namespace {

using ojson = nlohmann::ordered_json;

struct Outcome {
  std::string content, reasoning, error;
  std::vector<ToolCall> calls;
  bool done = false;
  int events_after_end = 0;
};

Outcome run_pieces(const std::vector<std::string>& pieces, ThinkingMode mode) {
  CompletionParser parser(mode);
  Outcome o;
  auto take = [&](std::vector<ParseEvent> events) {
    for (auto& e : events) {
      if (o.done || !o.error.empty()) ++o.events_after_end;
      switch (e.type) {
        case ParseEvent::Type::kReasoningDelta:
          EXPECT_EQ(e.text.find("DSML"), std::string::npos);
          o.reasoning += e.text;
          break;
        case ParseEvent::Type::kContentDelta:
          EXPECT_EQ(e.text.find("DSML"), std::string::npos) << "DSML markup leaked into content";
          o.content += e.text;
          break;
        case ParseEvent::Type::kToolCall: o.calls.push_back(e.tool_call); break;
        case ParseEvent::Type::kError: o.error = e.text; break;
        case ParseEvent::Type::kDone: o.done = true; break;
      }
    }
  };
  for (const auto& p : pieces) take(parser.feed(p));
  take(parser.finish());
  return o;
}

std::vector<std::vector<std::string>> splittings(const std::string& text, uint32_t seed) {
  std::vector<std::vector<std::string>> out;
  out.push_back({text});
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  out.push_back(bytes);
  std::mt19937 rng(seed);
  for (int k = 0; k < 20; ++k) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::uniform_int_distribution<size_t>(1, 9)(rng);
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    out.push_back(pieces);
  }
  // Token by token, as a server decodes them (the V4 tokenizer has the DSML and think tokens).
  auto ids = v4_tokenizer().encode(text);
  EXPECT_TRUE(ids.ok());
  std::vector<std::string> tokens;
  StreamDecoder dec(v4_tokenizer());
  for (TokenId id : *ids) tokens.push_back(*dec.push(id));
  tokens.push_back(dec.finish());
  out.push_back(tokens);
  return out;
}

TEST(CompletionParser, GoldenCompletionsInEveryPieceSize) {
  std::ifstream in(official_dir() + "/v41-parse-public.jsonl");
  ASSERT_TRUE(in);
  std::string line;
  int n_ok = 0, n_err = 0;
  while (std::getline(in, line)) {
    const ojson c = ojson::parse(line);
    const std::string name = c["name"].get<std::string>();
    const std::string text = c["completion"].get<std::string>();
    const ThinkingMode mode = c["thinking_mode"] == "thinking" ? ThinkingMode::kThinking : ThinkingMode::kChat;
    for (const auto& pieces : splittings(text, 7)) {
      const Outcome o = run_pieces(pieces, mode);
      EXPECT_EQ(o.events_after_end, 0) << name;
      if (c.contains("message")) {
        const ojson& m = c["message"];
        ASSERT_TRUE(o.error.empty()) << name << ": " << o.error;
        EXPECT_TRUE(o.done) << name;
        EXPECT_EQ(o.content, m["content"].get<std::string>()) << name;
        EXPECT_EQ(o.reasoning, m["reasoning_content"].get<std::string>()) << name;
        ASSERT_EQ(o.calls.size(), m["tool_calls"].size()) << name;
        for (size_t k = 0; k < o.calls.size(); ++k) {
          EXPECT_EQ(o.calls[k].name, m["tool_calls"][k]["function"]["name"].get<std::string>()) << name;
          EXPECT_EQ(o.calls[k].arguments, m["tool_calls"][k]["function"]["arguments"].get<std::string>()) << name;
        }
      } else {
        EXPECT_FALSE(o.error.empty()) << name << " must be rejected";
        EXPECT_FALSE(o.done) << name;
        std::string official = c["error"].get<std::string>();
        official = official.substr(official.find(": ") + 2);
        EXPECT_NE(o.error.find(official), std::string::npos) << name << ": got '" << o.error << "'";
      }
    }
    (c.contains("message") ? n_ok : n_err)++;
  }
  EXPECT_GE(n_ok, 4);
  EXPECT_GE(n_err, 4);
}

TEST(CompletionParser, HoldsBackPossibleMarkersAndFlushesFalseAlarms) {
  CompletionParser p(ThinkingMode::kChat);
  auto e1 = p.feed("a\n\n<");
  ASSERT_EQ(e1.size(), 1u);
  EXPECT_EQ(e1[0].text, "a");  // "\n\n<" may start the tool-call block
  auto e2 = p.feed("b");        // it did not
  ASSERT_EQ(e2.size(), 1u);
  EXPECT_EQ(e2[0].text, "\n\n<b");
  auto e3 = p.feed("<｜end▁of▁sentence｜>");
  EXPECT_TRUE(e3.empty());
  auto e4 = p.finish();
  ASSERT_EQ(e4.size(), 1u);
  EXPECT_EQ(e4[0].type, ParseEvent::Type::kDone);
}

TEST(CompletionParser, TruncatedToolCallIsAnError) {
  // The official parser would accept this half-written invoke; cedar reports it.
  const std::string text = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"x\">\n<｜DSML｜ parameter name=\"q\" string=\"true\">ab";
  auto r = parse_completion(text, ThinkingMode::kChat);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos);
}

TEST(CompletionParser, MalformedMarkupIsReportedAtOnce) {
  CompletionParser p(ThinkingMode::kChat);
  auto e = p.feed("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"x\">\n<｜DSML｜ parameter name=\"q\" string=\"maybe\">1</｜DSML｜ parameter>");
  ASSERT_FALSE(e.empty());
  EXPECT_EQ(e.back().type, ParseEvent::Type::kError);
  EXPECT_NE(e.back().text.find("Parameter format error"), std::string::npos);
  EXPECT_TRUE(p.failed());
  EXPECT_TRUE(p.feed("more").empty());
}

TEST(CompletionParser, SpecialTokensInContentAreRejected) {
  for (const char* text : {"a</think>b<｜end▁of▁sentence｜>", "a｜DSML｜b<｜end▁of▁sentence｜>",
                           "a<｜end▁of▁sentence｜>b"}) {
    EXPECT_FALSE(parse_completion(text, ThinkingMode::kChat).ok()) << text;
  }
  auto ok = parse_completion("r</think>c<｜end▁of▁sentence｜>", ThinkingMode::kThinking);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->reasoning_content, "r");
  EXPECT_EQ(ok->content, "c");
}

TEST(CompletionParser, ArgumentsRebuiltLikeTheOfficialDecoder) {
  // string="true" values are JSON-quoted; others are inserted as written.
  EXPECT_EQ(dsml_arguments_json({{"a", {"x \"y\"\n", true}}, {"b", {"[1, 2]", false}}}),
            "{\"a\": \"x \\\"y\\\"\\n\", \"b\": [1, 2]}");
  // A name with a quote and a value with '<' inside parse as the official regexes do.
  auto r = parse_completion(
      "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"a\"b\">\n<｜DSML｜ parameter name=\"k\" string=\"true\">1<2</｜DSML｜ "
      "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
      ThinkingMode::kChat);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->tool_calls.size(), 1u);
  EXPECT_EQ(r->tool_calls[0].name, "a\"b");
  EXPECT_EQ(r->tool_calls[0].arguments, "{\"k\": \"1<2\"}");
}

TEST(CompletionParser, RandomMarkupSplitsAnyWayGiveTheSameResult) {
  // Property: for random mixes of markup fragments, the result (message or error) does not depend
  // on how the text is cut into pieces, and nothing follows the final Done/Error event.
  const std::vector<std::string> frags = {
      "a", " ", "\n", "\n\n", "</think>", "<think>", "<｜end▁of▁sentence｜>", "\n\n<｜DSML｜ calls>\n",
      "<｜DSML｜ invoke name=\"f\">\n", "<｜DSML｜ parameter name=\"p\" string=\"true\">v</｜DSML｜ parameter>\n",
      "<｜DSML｜ parameter name=\"q\" string=\"false\">1</｜DSML｜ parameter>\n", "</｜DSML｜ invoke>\n",
      "</｜DSML｜ calls>", "｜DSML｜", "<", "é", "深"};
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) text += frags[rng() % frags.size()];
    const ThinkingMode mode = trial % 2 ? ThinkingMode::kThinking : ThinkingMode::kChat;
    const Outcome whole = run_pieces({text}, mode);
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    const Outcome split = run_pieces(bytes, mode);
    EXPECT_EQ(whole.done, split.done) << text;
    EXPECT_EQ(whole.error.empty(), split.error.empty()) << text;
    EXPECT_EQ(whole.content, split.content) << text;
    EXPECT_EQ(whole.reasoning, split.reasoning) << text;
    EXPECT_EQ(whole.calls.size(), split.calls.size()) << text;
    EXPECT_NE(whole.done, !whole.error.empty()) << "exactly one of Done/Error: " << text;
    EXPECT_EQ(whole.events_after_end + split.events_after_end, 0) << text;
  }
}

TEST(CompletionParser, V4FormatUsesUnspacedTags) {
  auto r = parse_completion(
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" string=\"false\">2</｜DSML｜"
      "parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
      ThinkingMode::kChat, PromptFormat::kV4);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->tool_calls.size(), 1u);
  EXPECT_EQ(r->tool_calls[0].arguments, "{\"n\": 2}");
}

}  // namespace
}  // namespace cedar::tokenizer
