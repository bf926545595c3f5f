// The streaming completion parser: the official parser's results on the golden well-formed
// completions (tests/tokenizer/data/official/v41-parse-public.jsonl), fed whole, byte by byte, in
// random pieces and token by token; deepseek-recipe 0.2.0's readings of malformed output (the
// expected values below are what recipe's StreamProcessor answers for the same text, probed with
// tests/serve/recipe's venv, Chat Completions with tools declared); and what streaming adds.
#include "chat/completion_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "tokenizer/marker_tokens.h"
#include "tokenizer/tokenizer.h"
#include "../tokenizer/tokenizer_test_util.h"

namespace cedar::chat {
namespace {

using tokenizer::AddedToken;
using tokenizer::kDsml;
using tokenizer::kEos;
using tokenizer::kThinkEnd;
using tokenizer::official_dir;
using tokenizer::StreamDecoder;
using tokenizer::TokenId;
using tokenizer::v4_tokenizer;

using ojson = nlohmann::ordered_json;

struct Outcome {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  bool done = false;
  int events_after_end = 0;
};

using Pieces = std::vector<std::pair<std::string, ChunkKind>>;

Outcome run_pieces(const Pieces& pieces, ThinkingMode mode, bool parse_tool_calls = true,
                   ParseStart start = ParseStart::kNewTurn) {
  CompletionParser parser(mode, start);
  parser.set_parse_tool_calls(parse_tool_calls);
  Outcome o;
  auto take = [&](std::vector<ParseEvent> events) {
    for (auto& e : events) {
      if (o.done) ++o.events_after_end;
      switch (e.type) {
        case ParseEvent::Type::kReasoningDelta: o.reasoning += e.text; break;
        case ParseEvent::Type::kContentDelta: o.content += e.text; break;
        case ParseEvent::Type::kToolCall: o.calls.push_back(e.tool_call); break;
        case ParseEvent::Type::kDone: o.done = true; break;
        case ParseEvent::Type::kStop: break;  // no stop sequences are set here
      }
    }
  };
  for (const auto& [text, kind] : pieces) take(parser.feed(text, kind));
  take(parser.finish());
  return o;
}

Outcome run_text(const std::string& text, ThinkingMode mode = ThinkingMode::kChat) {
  return run_pieces({{text, ChunkKind::kText}}, mode);
}

// The completion without its end-of-sentence marker (the engine stops on it; it is never parsed).
std::string before_eos(const std::string& text) { return text.substr(0, text.find(kEos)); }

// Token by token, as the server decodes them, each piece with its kind (the V4 tokenizer has the
// DSML and think tokens).
Pieces token_pieces(const std::string& text) {
  auto ids = v4_tokenizer().encode(text);
  EXPECT_TRUE(ids.ok());
  Pieces tokens;
  StreamDecoder dec(v4_tokenizer());
  for (TokenId id : *ids) {
    bool added = false;
    for (const AddedToken& t : v4_tokenizer().added_tokens()) added |= t.id == id;
    tokens.push_back({*dec.push(id), added ? ChunkKind::kSpecialToken : ChunkKind::kPlainTokens});
  }
  tokens.push_back({dec.finish(), ChunkKind::kPlainTokens});
  return tokens;
}

std::vector<Pieces> splittings(const std::string& text, uint32_t seed) {
  std::vector<Pieces> out;
  out.push_back({{text, ChunkKind::kText}});
  Pieces bytes;
  for (char c : text) bytes.push_back({std::string(1, c), ChunkKind::kText});
  out.push_back(bytes);
  std::mt19937 rng(seed);
  for (int k = 0; k < 20; ++k) {
    Pieces pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::uniform_int_distribution<size_t>(1, 9)(rng);
      pieces.push_back({text.substr(i, n), ChunkKind::kText});
      i += n;
    }
    out.push_back(pieces);
  }
  out.push_back(token_pieces(text));
  return out;
}

void expect_calls(const Outcome& o, const std::vector<std::pair<std::string, std::string>>& want) {
  ASSERT_EQ(o.calls.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(o.calls[k].name, want[k].first);
    EXPECT_EQ(o.calls[k].arguments, want[k].second);
  }
}

TEST(CompletionParser, GoldenCompletionsInEveryPieceSize) {
  // The official parser's error cases have recipe's readings instead (probed with its processor).
  const std::map<std::string, std::pair<ParsedCompletion, std::string>> recovered = {
      {"missing_think_end", {{"", "no end marker", {}}, "missing </think>: all of it is reasoning"}},
      {"missing_eos", {{"truncated answer", "", {}}, "no end-of-sentence token: the text is the answer"}},
      {"duplicate_param", {{"", "", {{"search", "{\"q\": \"a\", \"q\": \"b\"}"}}}, "both values are written"}},
      {"text_after_calls", {{"", "", {{"search", "{\"q\": \"a\"}"}}}, "text after the calls block is dropped"}},
  };
  std::ifstream in(official_dir() + "/v41-parse-public.jsonl");
  ASSERT_TRUE(in);
  std::string line;
  int n_ok = 0, n_recovered = 0;
  while (std::getline(in, line)) {
    const ojson c = ojson::parse(line);
    const std::string name = c["name"].get<std::string>();
    const std::string text = before_eos(c["completion"].get<std::string>());
    const ThinkingMode mode = c["thinking_mode"] == "thinking" ? ThinkingMode::kThinking : ThinkingMode::kChat;
    ParsedCompletion want;
    if (c.contains("message")) {
      const ojson& m = c["message"];
      want.content = m["content"].get<std::string>();
      want.reasoning_content = m["reasoning_content"].get<std::string>();
      for (const auto& call : m["tool_calls"])
        want.tool_calls.push_back(
            {call["function"]["name"].get<std::string>(), call["function"]["arguments"].get<std::string>()});
      ++n_ok;
    } else {
      ASSERT_TRUE(recovered.count(name)) << name << ": an official error case without recipe's reading";
      want = recovered.at(name).first;
      ++n_recovered;
    }
    for (const auto& pieces : splittings(text, 7)) {
      const Outcome o = run_pieces(pieces, mode);
      EXPECT_EQ(o.events_after_end, 0) << name;
      EXPECT_TRUE(o.done) << name;
      EXPECT_EQ(o.content, want.content) << name;
      EXPECT_EQ(o.reasoning, want.reasoning_content) << name;
      ASSERT_EQ(o.calls.size(), want.tool_calls.size()) << name;
      for (size_t k = 0; k < o.calls.size(); ++k) {
        EXPECT_EQ(o.calls[k].name, want.tool_calls[k].name) << name;
        EXPECT_EQ(o.calls[k].arguments, want.tool_calls[k].arguments) << name;
      }
    }
  }
  EXPECT_GE(n_ok, 4);
  EXPECT_EQ(n_recovered, static_cast<int>(recovered.size()));
}

TEST(CompletionParser, HoldsBackPossibleMarkersAndFlushesFalseAlarms) {
  CompletionParser p(ThinkingMode::kChat);
  auto e1 = p.feed("a\n\n<", ChunkKind::kText);
  ASSERT_EQ(e1.size(), 1u);
  EXPECT_EQ(e1[0].text, "a");  // "\n\n<" may start the tool calls
  auto e2 = p.feed("b", ChunkKind::kText);  // it did not
  ASSERT_EQ(e2.size(), 1u);
  EXPECT_EQ(e2[0].text, "\n\n<b");
  auto e3 = p.finish();
  ASSERT_EQ(e3.size(), 1u);
  EXPECT_EQ(e3[0].type, ParseEvent::Type::kDone);
  EXPECT_TRUE(p.done());
  EXPECT_TRUE(p.feed("more", ChunkKind::kText).empty());
}

// ---- deepseek-recipe's recoveries (each was an error of the official parser, a 500 before).

const std::string kInvokeF = "<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n";

TEST(CompletionParser, StopSequencesEndTheAnswerBeforeAnyMarkerAndOnlyInPlainText) {
  // Collects one run: content, the stop that matched, the calls.
  struct Run {
    std::string content, stop;
    size_t calls = 0;
  };
  const auto run = [](const std::vector<std::pair<std::string, ChunkKind>>& pieces, ThinkingMode mode) {
    CompletionParser p(mode);
    p.set_parse_tool_calls(true);
    p.set_stop_sequences({"", "\n\n", "<｜User｜>"});  // the empty one is ignored
    Run r;
    auto take = [&](const std::vector<ParseEvent>& events) {
      for (const ParseEvent& e : events) {
        if (e.type == ParseEvent::Type::kContentDelta) r.content += e.text;
        if (e.type == ParseEvent::Type::kStop) r.stop = e.text;
        if (e.type == ParseEvent::Type::kToolCall) ++r.calls;
      }
    };
    for (const auto& [text, kind] : pieces) take(p.feed(text, kind));
    take(p.finish());
    return r;
  };
  // The blank line before a calls block is a stop: the block is never read.
  Run r = run({{"Hi\n", ChunkKind::kPlainTokens}, {"\n<", ChunkKind::kPlainTokens},
               {"｜DSML｜", ChunkKind::kSpecialToken}, {" calls>\n" + kInvokeF, ChunkKind::kPlainTokens}},
              ThinkingMode::kChat);
  EXPECT_EQ(r.content, "Hi");
  EXPECT_EQ(r.stop, "\n\n");
  EXPECT_EQ(r.calls, 0u);
  // A stop spelling a special token: the token is not a stop, the same text in ordinary tokens is.
  r = run({{"A", ChunkKind::kPlainTokens}, {"<｜User｜>", ChunkKind::kSpecialToken}, {"B", ChunkKind::kPlainTokens}},
          ThinkingMode::kChat);
  EXPECT_EQ(r.content, "A<｜User｜>B");
  EXPECT_EQ(r.stop, "");
  r = run({{"A<｜Us", ChunkKind::kPlainTokens}, {"er｜>B", ChunkKind::kPlainTokens}}, ThinkingMode::kChat);
  EXPECT_EQ(r.content, "A");
  EXPECT_EQ(r.stop, "<｜User｜>");
  // The reasoning is not searched.
  r = run({{"a\n\nb", ChunkKind::kPlainTokens}, {"</think>", ChunkKind::kSpecialToken}, {"ok", ChunkKind::kPlainTokens}},
          ThinkingMode::kThinking);
  EXPECT_EQ(r.content, "ok");
  EXPECT_EQ(r.stop, "");
}

TEST(CompletionParserRecovery, CallsBlockRightAfterText) {
  const Outcome o = run_text("text<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" "
                             "string=\"true\">x</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  EXPECT_EQ(o.content, "text");
  expect_calls(o, {{"f", "{\"a\": \"x\"}"}});
}

TEST(CompletionParserRecovery, CallsBlockAfterOneNewline) {
  const Outcome o = run_text("text\n<｜DSML｜ calls>\n" + kInvokeF + "</｜DSML｜ calls>");
  EXPECT_EQ(o.content, "text");  // the newline before the marker belongs to it
  expect_calls(o, {{"f", "{}"}});
}

TEST(CompletionParserRecovery, InvokeWithoutCallsBlock) {
  const Outcome o = run_text("ok <｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"n\" string=\"false\">3</｜DSML｜ "
                             "parameter>\n</｜DSML｜ invoke>\nmore");
  EXPECT_EQ(o.content, "ok ");  // "more" stands in the tool calls, where text is skipped
  expect_calls(o, {{"f", "{\"n\": 3}"}});
}

TEST(CompletionParserRecovery, StrayMarkersInContentStayText) {
  const std::string text = "a ｜DSML｜ b </｜DSML｜ calls> c <think> d <｜begin▁of▁sentence｜> e";
  const Outcome o = run_text(text);
  EXPECT_EQ(o.content, text);
  EXPECT_TRUE(o.calls.empty());
}

TEST(CompletionParserRecovery, ThinkEndInContentIsDropped) {
  EXPECT_EQ(run_text("before</think>after").content, "beforeafter");
  // The answer goes on after it without dropping leading newlines.
  EXPECT_EQ(run_text("x</think>\n\ny").content, "x\n\ny");
}

TEST(CompletionParserRecovery, UnknownTagDropsTheRestOfTheTurn) {
  const Outcome o = run_text("hi<｜DSML｜ foo>\nrest of it\n<｜DSML｜ bar>");
  EXPECT_EQ(o.content, "hi");
  EXPECT_TRUE(o.calls.empty());
  // Only an invoke or the end of the block is read after it.
  const Outcome g = run_text("hi<｜DSML｜ foo>\n<｜DSML｜ invoke name=\"g\">\n</｜DSML｜ invoke>tail");
  EXPECT_EQ(g.content, "hi");
  expect_calls(g, {{"g", "{}"}});
}

TEST(CompletionParserRecovery, ToolCallsOpenInsideTheReasoning) {
  const Outcome o = run_text("think<｜DSML｜ calls>\n" + kInvokeF + "</｜DSML｜ calls>", ThinkingMode::kThinking);
  EXPECT_EQ(o.reasoning, "think");
  EXPECT_EQ(o.content, "");
  expect_calls(o, {{"f", "{}"}});
}

TEST(CompletionParserRecovery, MalformedParametersAreWrittenAsRead) {
  // An unknown string attribute: nothing after it is read into the call, which stays open.
  const Outcome bad = run_text("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"q\" "
                               "string=\"maybe\">1</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  expect_calls(bad, {{"f", "{\"q\": "}});
  // A call cut short is reported with what it has.
  const Outcome cut =
      run_text("\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"q\" string=\"true\">ab");
  expect_calls(cut, {{"f", "{\"q\": \"ab"}});
}

TEST(CompletionParserRecovery, NewlinesAtTheSeamsAreDropped) {
  const Outcome o = run_text("r\n\n</think>\n\nc\n\n", ThinkingMode::kThinking);
  EXPECT_EQ(o.reasoning, "r");
  EXPECT_EQ(o.content, "c\n\n");  // newlines that end the answer are kept
}

// recipe matches a marker's special-token part only against that token's own text: ordinary
// tokens that spell a marker are text.
TEST(CompletionParserRecovery, MarkersSpelledByOrdinaryTokensAreText) {
  const std::string block = " calls>\n" + kInvokeF + "</｜DSML｜ calls>";
  // The same block opened by the special token, then by ordinary tokens spelling it.
  const Outcome special = run_pieces({{"text<", ChunkKind::kPlainTokens},
                                      {std::string(kDsml), ChunkKind::kSpecialToken},
                                      {" calls>\n<", ChunkKind::kPlainTokens},
                                      {std::string(kDsml), ChunkKind::kSpecialToken},
                                      {" invoke name=\"f\">\n</", ChunkKind::kPlainTokens},
                                      {std::string(kDsml), ChunkKind::kSpecialToken},
                                      {" invoke>\n</", ChunkKind::kPlainTokens},
                                      {std::string(kDsml), ChunkKind::kSpecialToken},
                                      {" calls>", ChunkKind::kPlainTokens}},
                                     ThinkingMode::kChat);
  EXPECT_EQ(special.content, "text");
  expect_calls(special, {{"f", "{}"}});
  const Outcome spelled = run_pieces({{"text<" + std::string(kDsml) + " calls>", ChunkKind::kPlainTokens}},
                                     ThinkingMode::kChat);
  EXPECT_EQ(spelled.content, "text<｜DSML｜ calls>");
  EXPECT_TRUE(spelled.calls.empty());
  // </think> spelled in content is text too, and spelled in the reasoning does not end it.
  EXPECT_EQ(run_pieces({{"a</think>b", ChunkKind::kPlainTokens}}, ThinkingMode::kChat).content, "a</think>b");
  const Outcome thinking = run_pieces({{"r</think>", ChunkKind::kPlainTokens},
                                       {std::string(kThinkEnd), ChunkKind::kSpecialToken},
                                       {"c", ChunkKind::kPlainTokens}},
                                      ThinkingMode::kThinking);
  EXPECT_EQ(thinking.reasoning, "r</think>");
  EXPECT_EQ(thinking.content, "c");
}

TEST(CompletionParser, WithoutToolsDsmlIsContent) {
  const std::string text = "Sure.\n\n<｜DSML｜ calls>\n" + kInvokeF + "</｜DSML｜ calls>";
  const Outcome o = run_pieces({{text, ChunkKind::kText}}, ThinkingMode::kChat, /*parse_tool_calls=*/false);
  EXPECT_EQ(o.content, text);
  EXPECT_TRUE(o.calls.empty());
}

TEST(CompletionParser, ArgumentsRebuiltLikeTheOfficialDecoder) {
  // string="true" values are JSON-escaped between quotes; others are inserted as written; a value
  // with '<' inside stays whole.
  const ParsedCompletion r = parse_completion(
      "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"a\">\n<｜DSML｜ parameter name=\"k\" string=\"true\">1<2 \"q\"\n\t"
      "</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"b\" string=\"false\">[1, 2]</｜DSML｜ parameter>\n</｜DSML｜ "
      "invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
      ThinkingMode::kChat);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "a");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"k\": \"1<2 \\\"q\\\"\\n\\t\", \"b\": [1, 2]}");
}

TEST(CompletionParser, RandomMarkupSplitsAnyWayGiveTheSameResult) {
  // Property: for random mixes of markup fragments, the result does not depend on how the text is
  // cut into pieces, and nothing follows the final Done event.
  const std::vector<std::string> frags = {
      "a", " ", "\n", "\n\n", "</think>", "<think>", "\n\n<｜DSML｜ calls>\n",
      "<｜DSML｜ invoke name=\"f\">\n", "<｜DSML｜ parameter name=\"p\" string=\"true\">v</｜DSML｜ parameter>\n",
      "<｜DSML｜ parameter name=\"q\" string=\"false\">1</｜DSML｜ parameter>\n", "</｜DSML｜ invoke>\n",
      "</｜DSML｜ calls>", "｜DSML｜", "<", "é", "深"};
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) text += frags[rng() % frags.size()];
    const ThinkingMode mode = trial % 2 ? ThinkingMode::kThinking : ThinkingMode::kChat;
    const Outcome whole = run_pieces({{text, ChunkKind::kText}}, mode);
    Pieces bytes;
    for (char c : text) bytes.push_back({std::string(1, c), ChunkKind::kText});
    const Outcome split = run_pieces(bytes, mode);
    EXPECT_TRUE(whole.done && split.done) << text;
    EXPECT_EQ(whole.content, split.content) << text;
    EXPECT_EQ(whole.reasoning, split.reasoning) << text;
    ASSERT_EQ(whole.calls.size(), split.calls.size()) << text;
    for (size_t k = 0; k < whole.calls.size(); ++k) EXPECT_EQ(whole.calls[k].arguments, split.calls[k].arguments);
    EXPECT_EQ(whole.events_after_end + split.events_after_end, 0) << text;
  }
}

TEST(CompletionParser, V4FormatUsesUnspacedTags) {
  const ParsedCompletion r = parse_completion(
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" string=\"false\">2</｜DSML｜"
      "parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
      ThinkingMode::kChat);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"n\": 2}");
}

// ---- JSON output (a json_object response format: deepseek-recipe's parse_json_output). The
// expected values follow recipe's output parser rules and were confirmed with its StreamProcessor
// (tests/serve/recipe's venv, text chunks, one per piece below).

struct JsonRun {
  std::string content, stop;
  std::vector<ToolCall> calls;
  std::vector<ParseEvent> events;  // every event, in order
};

JsonRun run_json(const std::vector<std::string>& pieces, std::vector<std::string> stops = {},
                 ThinkingMode mode = ThinkingMode::kChat) {
  CompletionParser p(mode);
  p.set_parse_tool_calls(true);
  p.set_parse_json_output(true);
  p.set_stop_sequences(stops);
  JsonRun r;
  auto take = [&](std::vector<ParseEvent> events) {
    for (ParseEvent& e : events) {
      if (e.type == ParseEvent::Type::kContentDelta) r.content += e.text;
      if (e.type == ParseEvent::Type::kStop) r.stop = e.text;
      if (e.type == ParseEvent::Type::kToolCall) r.calls.push_back(e.tool_call);
      r.events.push_back(std::move(e));
    }
  };
  for (const std::string& piece : pieces) take(p.feed(piece, ChunkKind::kText));
  take(p.finish());
  return r;
}

std::vector<std::string> bytes_of(const std::string& text) {
  std::vector<std::string> out;
  for (char c : text) out.push_back(std::string(1, c));
  return out;
}

TEST(CompletionParserJson, FencedJsonIsTheAnswer) {
  EXPECT_EQ(run_json({"```json\n{\"a\": 1}\n```"}).content, "{\"a\": 1}");
  EXPECT_EQ(run_json({"```\n[1]\n```"}).content, "[1]");
  // The closing fence ends the JSON wherever it stands, inside a string too.
  EXPECT_EQ(run_json({"```json\n{\"k\": \"\n```\"}"}).content, "{\"k\": \" ");
  // A fence line must end right after its tag: "```python" is text, the JSON then starts at '['.
  EXPECT_EQ(run_json({"```", "python\nx = [1]\n```"}).content, "  [1]");
}

TEST(CompletionParserJson, BareJsonStartsAtTheFirstBracketAndRunsToTheEnd) {
  // The '{' / '[' is kept; nothing but a closing fence ends bare JSON, so the prose after it stays.
  EXPECT_EQ(run_json({"Here it is: {\"a\": [1, 2]} hope it helps"}).content, " {\"a\": [1, 2]} hope it helps");
  EXPECT_EQ(run_json({"A: ", "[1,", " 2]", "\n```", "\n", "bye"}).content, " [1, 2]  ");
  EXPECT_EQ(run_json({"```json{\"x\":1}"}).content, " {\"x\":1}");  // no newline: not a fence
  EXPECT_EQ(run_json({"no json at all"}).content, " ");
}

TEST(CompletionParserJson, TextAroundTheJsonIsOneSpacePerPiece) {
  const std::string text = "Sure, here:\n```json\n{\"a\": 1}\n```\nDone.";
  EXPECT_EQ(run_json({text}).content, " {\"a\": 1} ");
  // Byte by byte: "Sure, here:\n" is 12 pieces, "\nDone." after the fence 6.
  EXPECT_EQ(run_json(bytes_of(text)).content, std::string(12, ' ') + "{\"a\": 1}" + std::string(6, ' '));
  // Held bytes ("`" might open a fence) join the run of their own piece: "ab`" and "`x" give one
  // space each.
  EXPECT_EQ(run_json({"ab`", "`x{}"}).content, "  {}");
  // After the closing fence nothing is JSON any more, brackets included.
  EXPECT_EQ(run_json({"{\"a\": 1}\n```\n", "{\"b\": 2}"}).content, "{\"a\": 1}  ");
  // Leading newlines are dropped, spaces are text.
  EXPECT_EQ(run_json({"\n\n  [1, 2]"}).content, " [1, 2]");
  EXPECT_EQ(run_json(bytes_of("\n\n  [1, 2]")).content, "  [1, 2]");
  // A </think> before the JSON is dropped and splits the run; after the fence it is text.
  EXPECT_EQ(run_json({"x</think>y{}"}).content, "  {}");
  EXPECT_EQ(run_json({"```json\n{}\n```</think>z"}).content, "{} ");
}

TEST(CompletionParserJson, StopSequencesMatchOnlyInsideTheJson) {
  JsonRun r = run_json({"{\"a\": \"STOP\"}"}, {"STOP"});
  EXPECT_EQ(r.content, "{\"a\": \"");
  EXPECT_EQ(r.stop, "STOP");
  r = run_json({"{\"a\": \"ST", "OP\"}"}, {"STOP"});  // across pieces
  EXPECT_EQ(r.content, "{\"a\": \"");
  EXPECT_EQ(r.stop, "STOP");
  r = run_json({"STOP {\"a\": 1}"}, {"STOP"});
  EXPECT_EQ(r.content, " {\"a\": 1}");
  EXPECT_EQ(r.stop, "");
  r = run_json({"```json\n{}\n```\nSTOP"}, {"STOP"});
  EXPECT_EQ(r.content, "{} ");
  EXPECT_EQ(r.stop, "");
}

TEST(CompletionParserJson, ToolCallsOpenOutsideTheJsonOnly) {
  const std::string block = "\n\n<｜DSML｜ calls>\n" + kInvokeF + "</｜DSML｜ calls>";
  JsonRun r = run_json({"```json\n{\"a\": 1}\n```" + block});
  EXPECT_EQ(r.content, "{\"a\": 1}");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  r = run_json({"Let me call." + block});
  EXPECT_EQ(r.content, " ");
  EXPECT_EQ(r.calls.size(), 1u);
  // Inside bare JSON, DSML is JSON text.
  r = run_json({"{\"a\": 1} " + block});
  EXPECT_EQ(r.content, "{\"a\": 1} " + block);
  EXPECT_TRUE(r.calls.empty());
}

TEST(CompletionParserJson, ReasoningThenJson) {
  CompletionParser p(ThinkingMode::kThinking);
  p.set_parse_json_output(true);
  std::string content, reasoning;
  for (const auto& [text, kind] : Pieces{{"Think", ChunkKind::kPlainTokens}, {"</think>", ChunkKind::kSpecialToken},
                                         {"\n", ChunkKind::kPlainTokens}, {"\n", ChunkKind::kPlainTokens},
                                         {"Sure", ChunkKind::kPlainTokens}, {":", ChunkKind::kPlainTokens},
                                         {" ", ChunkKind::kPlainTokens}, {"{}", ChunkKind::kPlainTokens}})
    for (const ParseEvent& e : p.feed(text, kind)) {
      if (e.type == ParseEvent::Type::kContentDelta) content += e.text;
      if (e.type == ParseEvent::Type::kReasoningDelta) reasoning += e.text;
    }
  p.finish();
  EXPECT_EQ(reasoning, "Think");
  EXPECT_EQ(content, "   {}");
}

TEST(CompletionParserJson, StreamingHoldsFencesBackAndNamesTheSourceOfEveryDelta) {
  CompletionParser p(ThinkingMode::kChat);
  p.set_parse_json_output(true);
  // "ab" is one space for its piece; "`" is held (it may open a fence).
  std::vector<ParseEvent> e = p.feed("ab`", ChunkKind::kText);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, " ");
  EXPECT_TRUE(e[0].collapsed);
  EXPECT_EQ(e[0].source_begin, 0u);
  EXPECT_EQ(e[0].source_end, 2u);
  // "``json\n" completes the fence: nothing is shown.
  EXPECT_TRUE(p.feed("``json\n", ChunkKind::kText).empty());
  // The JSON's text, then "\n``" held as a possible closing fence.
  e = p.feed("{\"a\": 1}\n``", ChunkKind::kText);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, "{\"a\": 1}");
  EXPECT_FALSE(e[0].collapsed);
  EXPECT_EQ(e[0].source_begin, 10u);
  EXPECT_EQ(e[0].source_end, 18u);
  // "`" closes it, "\nok" after it is one space.
  e = p.feed("`\nok", ChunkKind::kText);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].text, " ");
  EXPECT_EQ(e[0].source_begin, 22u);
  EXPECT_EQ(e[0].source_end, 25u);
  e = p.finish();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].type, ParseEvent::Type::kDone);
}

TEST(CompletionParserJson, ACutTurnFlushesWhatWasHeld) {
  // Cut inside a possible closing fence: the held newline is JSON text after all.
  EXPECT_EQ(run_json({"{\"a\":", " 1}", "\n"}).content, "{\"a\": 1}\n");
  // Cut inside a possible opening fence: its bytes are text, one space per piece ("se ``" and "`js").
  EXPECT_EQ(run_json({"pro", "se ``", "`js"}).content, "   ");
}

TEST(CompletionParserJson, FencedJsonReadsTheSameHoweverItIsSplit) {
  // Without text around the JSON the pieces decide nothing.
  const std::string text = "```json\n{\"list\": [1, \"`\", \"\\n\"], \"s\": \"x``y\"}\n```";
  std::mt19937 rng(99);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t n = 1 + rng() % 6;
      pieces.push_back(text.substr(at, n));
      at += n;
    }
    EXPECT_EQ(run_json(pieces).content, "{\"list\": [1, \"`\", \"\\n\"], \"s\": \"x``y\"}");
  }
}


// A continued assistant message (Chat `prefix: true`) resumes where it stopped, keeping the newlines
// that begin the completion (deepseek-recipe's ReasoningContinuation / ContentContinuation); a new
// turn drops them. tests/serve/recipe (outputs "prefix_*") checks the same against deepseek-recipe.
TEST(CompletionParser, ContinuationsResumeInTheirStage) {
  const std::string text = "\n\nmore</think>\n\nanswer";
  const Outcome fresh = run_text(text, ThinkingMode::kThinking);
  EXPECT_EQ(fresh.reasoning, "more");
  EXPECT_EQ(fresh.content, "answer");
  const Outcome reasoning =
      run_pieces({{text, ChunkKind::kText}}, ThinkingMode::kThinking, true, ParseStart::kReasoningContinuation);
  EXPECT_EQ(reasoning.reasoning, "\n\nmore");
  EXPECT_EQ(reasoning.content, "answer");
  const Outcome content =
      run_pieces({{"\n\n more", ChunkKind::kText}}, ThinkingMode::kThinking, true, ParseStart::kContentContinuation);
  EXPECT_EQ(content.reasoning, "");
  EXPECT_EQ(content.content, "\n\n more");
  // Outside thinking mode a continuation parses as a new turn's answer, as deepseek-recipe's does.
  const Outcome chat =
      run_pieces({{"\n\n more", ChunkKind::kText}}, ThinkingMode::kChat, true, ParseStart::kContentContinuation);
  EXPECT_EQ(chat.content, " more");
}

}  // namespace
}  // namespace cedar::chat
