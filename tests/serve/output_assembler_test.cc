// OutputAssembler: the official parser's results on the golden completions
// (tests/tokenizer/data/official/v41-parse-public.jsonl, from DeepSeek's encoding.py) must come out of the token
// stream one token at a time, through the StreamSink events and the final Completion; stop strings
// are checked on hand-worked texts.
#include <gtest/gtest.h>
#include <map>

#include "serve/api/output_assembler.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

// Records the events as one string per kind, to compare against the final Completion.
class RecordingSink : public StreamSink {
 public:
  void on_start(const Completion&) override { ++starts; }
  void on_reasoning(std::string_view d) override { reasoning += d; }
  void on_content(std::string_view d, std::span<const TokenLogprob> lp) override {
    content += d;
    ++content_events;
    logprobs.insert(logprobs.end(), lp.begin(), lp.end());
  }
  void on_tool_call(size_t index, const ToolCall& call) override {
    EXPECT_EQ(index, calls.size());
    calls.push_back(call);
  }
  void on_finish(const Completion&) override { ++finishes; }
  void on_error(const ApiError&) override { ++errors; }
  int starts = 0, finishes = 0, errors = 0, content_events = 0;
  std::string reasoning, content;
  std::vector<ToolCall> calls;
  std::vector<TokenLogprob> logprobs;
};

runtime::GenerationResult result_of(const std::vector<int32_t>& ids, runtime::FinishReason finish) {
  runtime::GenerationResult r;
  r.output_ids = ids;
  r.finish_reason = finish;
  r.prompt_tokens = 10;
  r.cached_tokens = 4;
  return r;
}

TEST(OutputAssembler, ReproducesTheOfficialParserTokenByToken) {
  // Where the official parser fails, the turn reads as deepseek-recipe 0.2.0 reads it (its
  // StreamProcessor's answers for these completions): content, reasoning, calls as (name, arguments).
  struct Reading {
    std::string content, reasoning;
    std::vector<std::pair<std::string, std::string>> calls;
  };
  const std::map<std::string, Reading> recovered = {
      {"missing_think_end", {"", "no end marker", {}}},
      {"missing_eos", {"truncated answer", "", {}}},
      {"duplicate_param", {"", "", {{"search", "{\"q\": \"a\", \"q\": \"b\"}"}}}},
      {"text_after_calls", {"", "", {{"search", "{\"q\": \"a\"}"}}}},
  };
  const auto cases = test::read_jsonl(test::official_dir() + "/v41-parse-public.jsonl");
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::string completion = c["completion"];
    const std::vector<int32_t> ids = test::ids_of(completion);
    const bool has_eos = completion.find(test::kEos) != std::string::npos;
    OutputSettings settings;
    settings.thinking =
        c["thinking_mode"] == "thinking" ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
    RecordingSink sink;
    OutputAssembler assembler(test::test_tokenizer(), settings, &sink);
    for (int32_t id : ids) assembler.push(id);
    Completion turn;
    // Without EOS the engine stopped on its budget: a "length" turn.
    const auto error = assembler.finish(
        result_of(ids, has_eos ? runtime::FinishReason::kStop : runtime::FinishReason::kLength), &turn);
    ASSERT_FALSE(error.has_value()) << error->message;
    if (c.contains("error")) {
      const Reading& want = recovered.at(c["name"].get<std::string>());
      EXPECT_EQ(turn.content, want.content);
      EXPECT_EQ(turn.reasoning, want.reasoning);
      ASSERT_EQ(turn.tool_calls.size(), want.calls.size());
      for (size_t i = 0; i < want.calls.size(); ++i) {
        EXPECT_EQ(turn.tool_calls[i].name, want.calls[i].first);
        EXPECT_EQ(turn.tool_calls[i].arguments, want.calls[i].second);
      }
      if (!has_eos) {
        EXPECT_EQ(turn.finish, FinishKind::kLength);
      }
      continue;
    }
    ASSERT_FALSE(error.has_value()) << error->message;
    const auto& m = c["message"];
    EXPECT_EQ(turn.content, m["content"].get<std::string>());
    EXPECT_EQ(turn.reasoning, m["reasoning_content"].get<std::string>());
    ASSERT_EQ(turn.tool_calls.size(), m["tool_calls"].size());
    for (size_t i = 0; i < turn.tool_calls.size(); ++i) {
      EXPECT_EQ(turn.tool_calls[i].name, m["tool_calls"][i]["function"]["name"].get<std::string>());
      EXPECT_EQ(turn.tool_calls[i].arguments, m["tool_calls"][i]["function"]["arguments"].get<std::string>());
      EXPECT_EQ(turn.tool_calls[i].id.rfind("call_", 0), 0u);
    }
    EXPECT_EQ(turn.finish, turn.tool_calls.empty() ? FinishKind::kStop : FinishKind::kToolCalls);
    // The stream told the client exactly what the final turn holds, and never any markup.
    EXPECT_EQ(sink.content, turn.content);
    EXPECT_EQ(sink.reasoning, turn.reasoning);
    EXPECT_EQ(sink.calls.size(), turn.tool_calls.size());
    EXPECT_EQ(sink.content.find("DSML"), std::string::npos);
    EXPECT_EQ(turn.usage.prompt_tokens, 10);
    EXPECT_EQ(turn.usage.cached_tokens, 4);
    EXPECT_EQ(turn.usage.completion_tokens, static_cast<int>(ids.size()));
  }
}

TEST(OutputAssembler, ReasoningTokensCountUpToThinkEnd) {
  OutputSettings settings;
  settings.thinking = chat::ThinkingMode::kThinking;
  OutputAssembler assembler(test::test_tokenizer(), settings, nullptr);
  // Byte tokens: "abc" = 3 tokens of reasoning, then </think> (one token), then the answer.
  const auto ids = test::ids_of(std::string("abc</think>Yes") + test::kEos);
  for (int32_t id : ids) assembler.push(id);
  Completion turn;
  ASSERT_FALSE(assembler.finish(result_of(ids, runtime::FinishReason::kStop), &turn).has_value());
  EXPECT_EQ(turn.usage.reasoning_tokens, 3);
  EXPECT_EQ(turn.reasoning, "abc");
  EXPECT_EQ(turn.content, "Yes");
  EXPECT_EQ(assembler.raw_after_reasoning(), "Yes");
}

TEST(OutputAssembler, ReplayTextStartsAtTheThinkEndToken) {
  OutputSettings settings;
  settings.thinking = chat::ThinkingMode::kThinking;
  settings.parse_tool_calls = true;
  {
    // A `</think>` spelled with ordinary tokens is reasoning text; the answer starts after the token.
    OutputAssembler assembler(test::test_tokenizer(), settings, nullptr);
    std::vector<int32_t> ids = test::ids_of("ab");
    for (const char* piece : {"<", "/think>", "cd"})
      for (int32_t id : test::ids_of(piece)) ids.push_back(id);
    for (int32_t id : test::ids_of(std::string("</think>Yes") + test::kEos)) ids.push_back(id);
    for (int32_t id : ids) assembler.push(id);
    Completion turn;
    ASSERT_FALSE(assembler.finish(result_of(ids, runtime::FinishReason::kStop), &turn).has_value());
    EXPECT_EQ(turn.reasoning, "ab</think>cd");
    EXPECT_EQ(turn.content, "Yes");
    EXPECT_EQ(assembler.raw_after_reasoning(), "Yes");
  }
  {
    // Calls opened inside the reasoning: no answer part, so nothing to replay (the client's message
    // renders the calls), rather than an empty text that would drop them.
    OutputAssembler assembler(test::test_tokenizer(), settings, nullptr);
    const auto ids = test::ids_of(std::string("plan<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n") +
                                  "</｜DSML｜ invoke>\n</｜DSML｜ calls>" + test::kEos);
    for (int32_t id : ids) assembler.push(id);
    Completion turn;
    ASSERT_FALSE(assembler.finish(result_of(ids, runtime::FinishReason::kStop), &turn).has_value());
    EXPECT_EQ(turn.reasoning, "plan");
    EXPECT_EQ(turn.usage.reasoning_tokens, 4) << "the reasoning text's tokens (one per byte here), as deepseek-recipe counts";
    ASSERT_EQ(turn.tool_calls.size(), 1u);
    EXPECT_EQ(turn.tool_calls[0].name, "f");
    EXPECT_EQ(turn.finish, FinishKind::kToolCalls);
    EXPECT_FALSE(assembler.raw_after_reasoning().has_value());
  }
}

struct StopCase {
  std::string output;
  std::vector<std::string> stop;
  std::string content;
  std::string matched;
};

TEST(OutputAssembler, StopStringsCutTheContent) {
  const StopCase cases[] = {
      {"Hello world", {"o w"}, "Hell", "o w"},
      {"Hello world", {"xyz"}, "Hello world", ""},
      {"Hello world", {"world", "llo"}, "He", "llo"},  // the earliest match wins
      {"a\xC3\xA9" "bc", {"bc"}, "a\xC3\xA9", "bc"},     // multi-byte text before the match
      {"abc", {"abc"}, "", "abc"},
      {"ab", {"abc"}, "ab", ""},                         // a partial match at the end is content
  };
  for (const StopCase& c : cases) {
    SCOPED_TRACE(c.output);
    OutputSettings settings;
    settings.stop = c.stop;
    RecordingSink sink;
    OutputAssembler assembler(test::test_tokenizer(), settings, &sink);
    const auto ids = test::ids_of(c.output + test::kEos);
    size_t pushed = 0;
    for (int32_t id : ids) {
      if (assembler.wants_stop()) break;
      assembler.push(id);
      ++pushed;
    }
    Completion turn;
    const auto finish = c.matched.empty() ? runtime::FinishReason::kStop : runtime::FinishReason::kCancelled;
    ASSERT_FALSE(assembler.finish(result_of({ids.begin(), ids.begin() + pushed}, finish), &turn).has_value());
    EXPECT_EQ(turn.content, c.content);
    EXPECT_EQ(sink.content, c.content);
    EXPECT_EQ(turn.matched_stop, c.matched);
    EXPECT_EQ(turn.finish, FinishKind::kStop);
  }
}

TEST(OutputAssembler, HeldBackTextIsValidUtf8InEveryDelta) {
  OutputSettings settings;
  settings.stop = {"\xE2\x82\xAC\xE2\x82\xAC"};  // "€€"
  // Each delta handed to the sink must be whole characters even while text is held back.
  class Utf8Sink : public RecordingSink {
   public:
    void on_content(std::string_view d, std::span<const TokenLogprob> lp) override {
      auto ids = test::test_tokenizer().encode(d);
      EXPECT_TRUE(ids.ok()) << "a delta split a character";
      RecordingSink::on_content(d, lp);
    }
  } sink;
  OutputAssembler assembler(test::test_tokenizer(), settings, &sink);
  const std::string text = "x\xE2\x82\xAC" "y\xE2\x82\xAC" "z\xC3\xA9\xC3\xA9\xC3\xA9";
  const auto ids = test::ids_of(text + test::kEos);
  for (int32_t id : ids) assembler.push(id);
  Completion turn;
  ASSERT_FALSE(assembler.finish(result_of(ids, runtime::FinishReason::kStop), &turn).has_value());
  EXPECT_EQ(turn.content, text);
  EXPECT_EQ(sink.content, text);
}

TEST(OutputAssembler, RawModeShowsTextWithoutSpecialTokens) {
  OutputSettings settings;
  settings.mode = OutputMode::kRaw;
  OutputAssembler assembler(test::test_tokenizer(), settings, nullptr);
  const auto ids = test::ids_of(std::string("1 2 3") + test::kEos);
  for (int32_t id : ids) assembler.push(id);
  Completion turn;
  ASSERT_FALSE(assembler.finish(result_of(ids, runtime::FinishReason::kStop), &turn).has_value());
  EXPECT_EQ(turn.content, "1 2 3");
  EXPECT_EQ(turn.finish, FinishKind::kStop);
}

// A call cut by max_tokens after its name is reported with the arguments written so far, as
// deepseek-recipe 0.2.0 reports it (its processor answers ("get_weather", "") for this text).
TEST(OutputAssembler, TruncatedToolCallKeepsWhatItHas) {
  OutputSettings settings;
  RecordingSink sink;
  OutputAssembler assembler(test::test_tokenizer(), settings, &sink);
  const auto ids = test::ids_of("Checking.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ param");
  for (int32_t id : ids) assembler.push(id);
  Completion turn;
  ASSERT_FALSE(assembler.finish(result_of(ids, runtime::FinishReason::kLength), &turn).has_value());
  EXPECT_EQ(turn.finish, FinishKind::kLength);
  EXPECT_EQ(turn.content, "Checking.");
  ASSERT_EQ(turn.tool_calls.size(), 1u);
  EXPECT_EQ(turn.tool_calls[0].name, "get_weather");
  EXPECT_EQ(turn.tool_calls[0].arguments, "");
  EXPECT_EQ(sink.content, "Checking.");
}


// max_tokens can cut a DSML marker inside a multi-byte character ("｜" is three bytes). The held-back
// byte becomes U+FFFD when the text is flushed, which no marker continues; that is the cut, not a
// malformed output (found by the 1,000-sample constrained run: a 500 for a turn cut at max_tokens).
TEST(OutputAssembler, TruncationInsideAMarkerCharacterIsALengthTurn) {
  OutputSettings settings;
  RecordingSink sink;
  OutputAssembler assembler(test::test_tokenizer(), settings, &sink);
  auto ids = test::ids_of(
      "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" "
      "string=\"true\">Paris</｜DSML｜ parameter>\n</");
  // The byte-level token of the byte 0xEF alone (GPT-2's byte alphabet maps it to U+00EF), the first
  // byte of "｜".
  const auto first_byte = test::test_tokenizer().token_to_id("\u00ef");
  ASSERT_TRUE(first_byte.has_value());
  ids.push_back(*first_byte);
  for (int32_t id : ids) assembler.push(id);
  ASSERT_FALSE(assembler.wants_stop()) << "nothing is wrong before the text is flushed";
  Completion turn;
  const auto error = assembler.finish(result_of(ids, runtime::FinishReason::kLength), &turn);
  ASSERT_FALSE(error.has_value()) << error->message;
  EXPECT_EQ(turn.finish, FinishKind::kLength);
  // The open call, as deepseek-recipe reports it: the flushed U+FFFD stands where text is skipped.
  ASSERT_EQ(turn.tool_calls.size(), 1u);
  EXPECT_EQ(turn.tool_calls[0].arguments, "{\"city\": \"Paris\"");
  EXPECT_EQ(sink.errors, 0);
}

TEST(OutputAssembler, ACharacterCutShortAtTheEndIsDropped) {
  // deepseek-recipe's decoder drops the ids it still buffers when the stream ends: "Hi" and the
  // first byte of "é" read as "Hi", without a replacement character.
  const auto lead_byte = test::test_tokenizer().token_to_id("\u00c3");  // GPT-2's byte alphabet: 0xC3
  ASSERT_TRUE(lead_byte.has_value());
  for (const bool thinking : {false, true}) {
    OutputSettings settings;
    settings.thinking = thinking ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
    RecordingSink sink;
    OutputAssembler assembler(test::test_tokenizer(), settings, &sink);
    auto ids = test::ids_of(thinking ? "r</think>Hi" : "Hi");
    ids.push_back(*lead_byte);
    for (int32_t id : ids) assembler.push(id);
    Completion turn;
    ASSERT_FALSE(assembler.finish(result_of(ids, runtime::FinishReason::kLength), &turn).has_value());
    EXPECT_EQ(turn.content, "Hi");
    EXPECT_EQ(sink.content, "Hi");
    EXPECT_EQ(turn.finish, FinishKind::kLength);
  }
}

}  // namespace
}  // namespace cedar::serve
