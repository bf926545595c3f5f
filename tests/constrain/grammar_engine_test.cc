// The constrained-decoding glue over xgrammar (constrain/grammar_engine.h), on the repository's
// DeepSeek-V4-series tokenizer: masks from compiled grammars, accept, termination, reset, the
// thinking gate, the DSML tool-call grammar. Expected behaviour is stated from the grammars and the
// tokenizer's own encodings, never from the code under test.
#include "constrain/grammar_engine.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"
#include "constrain_test_util.h"

namespace cedar::constrain {
namespace {

using test_util::kVocab;
using test_util::tok;
using test_util::engine;

int32_t id_of(std::string_view token) {
  auto id = tok().token_to_id(token);
  if (!id) throw std::runtime_error("no token " + std::string(token));
  return *id;
}

int32_t eos() { return id_of("<｜end▁of▁sentence｜>"); }

bool allowed(const uint32_t* mask, int32_t id) { return mask == nullptr || ((mask[id / 32] >> (id % 32)) & 1u); }

std::shared_ptr<GrammarConstraint> start(ConstraintKind kind, std::string text, bool after_think_end = false) {
  ConstraintSpec spec;
  spec.kind = kind;
  spec.text = std::move(text);
  spec.after_think_end = after_think_end;
  auto c = engine().start(spec);
  if (!c.ok()) throw std::runtime_error(c.status().to_string());
  return *c;
}

// Feeds the tokenizer's encoding of `text` (added tokens recognised), checking each id is allowed first.
void feed(GrammarConstraint& c, std::string_view text) {
  auto ids = tok().encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  for (int32_t id : *ids) {
    ASSERT_TRUE(allowed(c.next_token_mask(), id)) << "token " << id << " of " << text << " masked";
    ASSERT_TRUE(c.accept_token(id)) << "token " << id << " of " << text << " rejected";
  }
}

int count_allowed(const uint32_t* mask) {
  int n = 0;
  for (int id = 0; id < kVocab; ++id) n += allowed(mask, id);
  return n;
}

TEST(GrammarEngine, RegexMaskAcceptAndTermination) {
  auto c = start(ConstraintKind::kRegex, "[ab]{3}");
  const uint32_t* mask = c->next_token_mask();
  ASSERT_NE(mask, nullptr);
  EXPECT_TRUE(allowed(mask, id_of("a")));
  EXPECT_TRUE(allowed(mask, id_of("b")));
  EXPECT_FALSE(allowed(mask, id_of("c")));
  EXPECT_FALSE(allowed(mask, eos())) << "the pattern needs three characters first";
  feed(*c, "aba");
  mask = c->next_token_mask();
  ASSERT_NE(mask, nullptr);
  EXPECT_EQ(count_allowed(mask), 1) << "only the stop token completes [ab]{3} after three characters";
  EXPECT_TRUE(allowed(mask, eos()));
  EXPECT_FALSE(c->terminated());
  EXPECT_TRUE(c->accept_token(eos()));
  EXPECT_TRUE(c->terminated());
}

TEST(GrammarEngine, RejectsATokenOutsideTheGrammar) {
  auto c = start(ConstraintKind::kRegex, "[0-9]+");
  EXPECT_FALSE(c->accept_token(id_of("x")));
}

TEST(GrammarEngine, ResetStartsOver) {
  auto c = start(ConstraintKind::kRegex, "ab");
  feed(*c, "ab");
  EXPECT_FALSE(allowed(c->next_token_mask(), id_of("a")));
  c->reset();
  EXPECT_TRUE(allowed(c->next_token_mask(), id_of("a")));
  EXPECT_FALSE(allowed(c->next_token_mask(), id_of("b")));
  feed(*c, "ab");
  EXPECT_TRUE(c->accept_token(eos()));
  EXPECT_TRUE(c->terminated());
}

TEST(GrammarEngine, JsonSchemaAcceptsAValidDocumentAndMasksTheRest) {
  const std::string schema =
      R"({"type":"object","properties":{"n":{"type":"integer"},"e":{"enum":["x","y"]}},"required":["n","e"],"additionalProperties":false})";
  auto c = start(ConstraintKind::kJson, schema);
  const uint32_t* mask = c->next_token_mask();
  EXPECT_FALSE(allowed(mask, id_of("[")));
  EXPECT_FALSE(allowed(mask, id_of("x")));
  EXPECT_FALSE(allowed(mask, eos()));
  feed(*c, R"({"n": -12, "e": )");
  mask = c->next_token_mask();
  EXPECT_FALSE(allowed(mask, id_of("1"))) << "e is an enum of strings";
  feed(*c, R"("y"})");
  EXPECT_TRUE(allowed(c->next_token_mask(), eos()));
  EXPECT_TRUE(c->accept_token(eos()));
  EXPECT_TRUE(c->terminated());
}

TEST(GrammarEngine, AnyJsonObjectOrArray) {
  auto c = start(ConstraintKind::kJson, "");
  const uint32_t* mask = c->next_token_mask();
  EXPECT_FALSE(allowed(mask, id_of("x")));
  // A top-level scalar would be text to the JSON output reading (only `{` / `[` open JSON there).
  EXPECT_FALSE(allowed(mask, id_of("1")));
  EXPECT_FALSE(allowed(mask, id_of("\"")));
  EXPECT_FALSE(allowed(mask, id_of("true")));
  EXPECT_TRUE(allowed(mask, id_of("[")));
  feed(*c, R"({"a": [1, 2.5, true, null, "s"]})");
  EXPECT_TRUE(c->accept_token(eos()));
  EXPECT_TRUE(c->terminated());
  auto array = start(ConstraintKind::kJson, "");
  feed(*array, R"([{"b": {}}, "x", 3])");
  EXPECT_TRUE(array->accept_token(eos()));
}

TEST(GrammarEngine, ControlTokensAreNeverAllowed) {
  auto c = start(ConstraintKind::kJson, "");
  feed(*c, R"({"a": ")");
  const uint32_t* mask = c->next_token_mask();
  for (std::string_view marker : {"<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜begin▁of▁sentence｜>"})
    EXPECT_FALSE(allowed(mask, id_of(marker))) << marker;
  EXPECT_FALSE(allowed(mask, eos())) << "a string is open";
  EXPECT_TRUE(allowed(mask, id_of("hello")));
}

TEST(GrammarEngine, ThinkingIsFreeUntilThinkEnd) {
  auto c = start(ConstraintKind::kRegex, "yes|no", /*after_think_end=*/true);
  // The reasoning is free text: everything but the end of the turn, since the answer must follow.
  EXPECT_EQ(count_allowed(c->next_token_mask()), kVocab - 1);
  EXPECT_FALSE(allowed(c->next_token_mask(), eos()));
  EXPECT_TRUE(allowed(c->next_token_mask(), id_of("｜DSML｜"))) << "no tools: a marker in the reasoning is text";
  EXPECT_TRUE(c->accept_token(id_of("Whatever")));
  EXPECT_TRUE(c->accept_token(id_of("<think>")));
  EXPECT_TRUE(c->accept_token(id_of("</think>")));
  const uint32_t* mask = c->next_token_mask();
  ASSERT_NE(mask, nullptr);
  EXPECT_TRUE(allowed(mask, id_of("yes")));
  EXPECT_FALSE(allowed(mask, id_of("Whatever")));
  c->reset();
  EXPECT_TRUE(allowed(c->next_token_mask(), id_of("Whatever"))) << "reset goes back before </think>";
  EXPECT_FALSE(c->accept_token(eos())) << "the reasoning cannot end the turn";
}

const std::string kTools =
    R"([{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}},{"name":"ping"}])";

TEST(GrammarEngine, ToolCallsCannotOpenInsideTheReasoning) {
  // deepseek-recipe reads a DSML marker in the reasoning as the start of the calls block; under a
  // tool grammar the calls must come after </think>, where their arguments are checked.
  auto c = start(ConstraintKind::kToolCall, kTools, /*after_think_end=*/true);
  const uint32_t* reasoning = c->next_token_mask();
  EXPECT_EQ(count_allowed(reasoning), kVocab - 2);
  EXPECT_FALSE(allowed(reasoning, id_of("｜DSML｜")));
  EXPECT_FALSE(allowed(reasoning, eos()));
  EXPECT_TRUE(allowed(reasoning, id_of("<")));
  EXPECT_FALSE(c->accept_token(id_of("｜DSML｜")));
  c->reset();
  feed(*c, "Let me look.</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"ping\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  EXPECT_TRUE(c->accept_token(eos()));
  EXPECT_TRUE(c->terminated());
}

TEST(GrammarEngine, RequiredToolCallFollowsTheSchema) {
  auto c = start(ConstraintKind::kToolCallRequired, kTools);
  // The prompt ends with "<｜DSML｜ calls>\n": the output starts with an invoke, never with text.
  EXPECT_FALSE(allowed(c->next_token_mask(), id_of("Hello")));
  EXPECT_FALSE(allowed(c->next_token_mask(), eos()));
  feed(*c,
       "<｜DSML｜ invoke name=\"get_weather\">\n"
       "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
       "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n"
       "</｜DSML｜ invoke>\n"
       "</｜DSML｜ calls>");
  EXPECT_TRUE(allowed(c->next_token_mask(), eos()));
  EXPECT_TRUE(c->accept_token(eos()));
  EXPECT_TRUE(c->terminated());
}

// Accepts `text` token by token; false at the first token the grammar refuses.
bool accepts(GrammarConstraint& c, std::string_view text) {
  auto ids = tok().encode(text);
  if (!ids.ok()) return false;
  for (int32_t id : *ids)
    if (!allowed(c.next_token_mask(), id) || !c.accept_token(id)) return false;
  return true;
}

// The `date` format follows the calendar (cmake/Xgrammar.cmake, local fix 3): a day exists in its
// month, February 29 only in leap years, no year 0000. The expectations are the Gregorian rules
// (as Python's datetime.date reads RFC 3339 full-dates), not the grammar's output.
TEST(GrammarEngine, DateFormatsFollowTheCalendar) {
  const std::string date = R"({"type":"string","format":"date"})";
  const std::string date_time = R"({"type":"string","format":"date-time"})";
  const auto ok = [&](const std::string& schema, const std::string& value) {
    auto c = start(ConstraintKind::kJson, schema);
    return accepts(*c, "\"" + value + "\"") && allowed(c->next_token_mask(), eos());
  };
  for (const char* valid : {"2024-02-29", "2000-02-29", "1600-02-29", "0004-02-29", "2023-02-28", "2023-04-30",
                            "2023-12-31", "0001-01-01", "9999-12-31"})
    EXPECT_TRUE(ok(date, valid)) << valid;
  for (const char* invalid : {"2023-02-29", "1900-02-29", "2100-02-29", "2023-04-31", "2023-06-31", "2023-09-31",
                              "2023-11-31", "2023-02-30", "0000-01-01", "2023-13-01", "2023-00-10", "2023-01-00"})
    EXPECT_FALSE(ok(date, invalid)) << invalid;
  EXPECT_TRUE(ok(date_time, "2024-02-29T23:59:59Z"));
  EXPECT_FALSE(ok(date_time, "2023-02-29T23:59:59Z"));
  EXPECT_FALSE(ok(date_time, "2023-09-31T00:00:00+01:00"));
}

TEST(GrammarEngine, RequiredToolCallRefusesUndeclaredToolsAndBadArguments) {
  EXPECT_FALSE(accepts(*start(ConstraintKind::kToolCallRequired, kTools), "<｜DSML｜ invoke name=\"rm\">"));
  EXPECT_FALSE(accepts(*start(ConstraintKind::kToolCallRequired, kTools),
                       "<｜DSML｜ invoke name=\"get_weather\">\n"
                       "<｜DSML｜ parameter name=\"days\" string=\"false\">three"));
  // A required property cannot be left out: the invoke cannot close without "city".
  EXPECT_FALSE(accepts(*start(ConstraintKind::kToolCallRequired, kTools),
                       "<｜DSML｜ invoke name=\"get_weather\">\n</｜DSML｜ invoke>"));
}

TEST(GrammarEngine, AutoToolCallAllowsTextThenOneCallsBlock) {
  auto c = start(ConstraintKind::kToolCall, kTools);
  feed(*c, "Let me check.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"ping\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  EXPECT_TRUE(c->accept_token(eos()));
  EXPECT_TRUE(c->terminated());
  auto text_only = start(ConstraintKind::kToolCall, kTools);
  feed(*text_only, "No tool needed.");
  EXPECT_TRUE(text_only->accept_token(eos()));
  EXPECT_FALSE(accepts(*start(ConstraintKind::kToolCall, kTools), "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"rm\">"));
}

// String lengths in tool parameters: the raw value of a string="true" parameter and a JSON string
// nested in a string="false" one. xgrammar 0.2.9 dropped both bounds under the DSML grammar's
// exclusion of "</｜DSML｜" (local fix 2 in cmake/Xgrammar.cmake). Lengths count code points.
const std::string kBoundedTools =
    R"([{"name":"tag","parameters":{"type":"object","properties":{)"
    R"("code":{"type":"string","minLength":1,"maxLength":3},)"
    R"("todos":{"type":"array","items":{"type":"object","properties":{"content":{"type":"string","minLength":1,"maxLength":3}},)"
    R"("required":["content"],"additionalProperties":false}},)"
    R"("id":{"type":"string","pattern":"^[a-z]{2}[0-9]$"},"day":{"type":"string","format":"date"}},)"
    R"("required":["code"],"additionalProperties":false}}])";

std::string tag_call(const std::string& parameters) {
  return "<｜DSML｜ invoke name=\"tag\">\n" + parameters + "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
}
std::string raw_parameter(const std::string& name, const std::string& value) {
  return "<｜DSML｜ parameter name=\"" + name + "\" string=\"true\">" + value + "</｜DSML｜ parameter>\n";
}
bool tag_call_accepted(const std::string& parameters) {
  auto c = start(ConstraintKind::kToolCallRequired, kBoundedTools);
  return accepts(*c, tag_call(parameters)) && c->accept_token(eos()) && c->terminated();
}

TEST(GrammarEngine, DsmlToolStringLengths) {
  for (const std::string value : {"a", "ab", "abc", "x y", "é", "ééé", "<", "</a", "a\nb"})
    EXPECT_TRUE(tag_call_accepted(raw_parameter("code", value))) << value;
  for (const std::string value : {"", "abcd", "éééé", "abc ", " abc", "a\nbc"})
    EXPECT_FALSE(tag_call_accepted(raw_parameter("code", value))) << value;
  const auto todos = [](const std::string& content) {
    return raw_parameter("code", "a") +
           "<｜DSML｜ parameter name=\"todos\" string=\"false\">[{\"content\": \"" + content +
           "\"}]</｜DSML｜ parameter>\n";
  };
  for (const std::string value : {"a", "abc", "é<é"}) EXPECT_TRUE(tag_call_accepted(todos(value))) << value;
  for (const std::string value : {"", "abcd"}) EXPECT_FALSE(tag_call_accepted(todos(value))) << value;
  // The trade-off of the fix: a length-bounded string leaves out "｜", the exclusion's non-ASCII
  // character, so it can never hold the closing marker; an unbounded one still can hold "｜".
  EXPECT_FALSE(tag_call_accepted(raw_parameter("code", "a｜")));
}

TEST(GrammarEngine, DsmlToolStringPatternsAndFormats) {
  const std::string code = raw_parameter("code", "a");
  EXPECT_TRUE(tag_call_accepted(code + raw_parameter("id", "ab1")));
  for (const std::string value : {"Ab1", "ab", "ab12", "abc"})
    EXPECT_FALSE(tag_call_accepted(code + raw_parameter("id", value))) << value;
  EXPECT_TRUE(tag_call_accepted(code + raw_parameter("day", "2026-12-07")));
  for (const std::string value : {"2026-13-07", "07.12.2026", "soon"})
    EXPECT_FALSE(tag_call_accepted(code + raw_parameter("day", value))) << value;
}

// Budget-aware closing (GrammarConstraint::mask_to_finish_within). Lengths are counted in the
// single-byte tokens a closing path is made of.
TEST(GrammarEngine, ClosingNarrowsToTheTokensAfterWhichTheOutputStillFits) {
  auto c = start(ConstraintKind::kJson, "");
  feed(*c, "{\"a\": [[");
  ASSERT_NE(c->next_token_mask(), nullptr);
  // Open: "]]}" (3) closes. Another "[" needs "]]]}" (4).
  EXPECT_EQ(c->mask_to_finish_within(id_of("["), 4), nullptr);
  EXPECT_EQ(c->mask_to_finish_within(id_of("["), kMaxClosingTokens), nullptr) << "far from the end: no check";
  const uint32_t* narrowed = c->mask_to_finish_within(id_of("["), 3);
  ASSERT_NE(narrowed, nullptr);
  EXPECT_TRUE(allowed(narrowed, id_of("]"))) << "then \"]}\" (2)";
  EXPECT_TRUE(allowed(narrowed, id_of("0"))) << "then \"]]}\" (3)";
  EXPECT_FALSE(allowed(narrowed, id_of("[")));
  EXPECT_FALSE(allowed(narrowed, id_of("\""))) << "a string needs \"\\\"]]}\" (4)";
  EXPECT_FALSE(allowed(narrowed, id_of("]]"))) << "only single-byte tokens are offered";
  narrowed = c->mask_to_finish_within(id_of("["), 2);
  ASSERT_NE(narrowed, nullptr);
  EXPECT_TRUE(allowed(narrowed, id_of("]")));
  EXPECT_FALSE(allowed(narrowed, id_of("0")));
  // When even the closing path from here does not fit, nothing helps: no narrowing.
  EXPECT_EQ(c->mask_to_finish_within(id_of("["), 1), nullptr);
  EXPECT_TRUE(c->accept_token(id_of("]")));
  EXPECT_TRUE(c->accept_token(id_of("]")));
  ASSERT_NE(c->next_token_mask(), nullptr);
  // Complete after "}": the end of sentence fits any budget.
  narrowed = c->mask_to_finish_within(id_of("}"), 0);
  EXPECT_EQ(narrowed, nullptr);
  EXPECT_TRUE(c->accept_token(id_of("}")));
  ASSERT_NE(c->next_token_mask(), nullptr);
  EXPECT_EQ(c->mask_to_finish_within(eos(), 0), nullptr);
}

TEST(GrammarEngine, ClosingEndsReasoningWhenTheAnswerWouldNotFit) {
  auto c = start(ConstraintKind::kRegex, "yes|no", /*after_think_end=*/true);
  EXPECT_TRUE(allowed(c->next_token_mask(), id_of("Whatever")));
  // After "</think>" the answer needs "no" (2); one more reasoning token leaves 2 only with 3 left.
  EXPECT_EQ(c->mask_to_finish_within(id_of("Whatever"), 3), nullptr);
  const uint32_t* narrowed = c->mask_to_finish_within(id_of("Whatever"), 2);
  ASSERT_NE(narrowed, nullptr);
  EXPECT_EQ(count_allowed(narrowed), 1);
  EXPECT_TRUE(allowed(narrowed, id_of("</think>")));
  EXPECT_EQ(c->mask_to_finish_within(id_of("</think>"), 2), nullptr);
}

// A random sampler that prefers opening tokens, under budgets from tight to loose: whatever it picks,
// asking mask_to_finish_within before each token leaves a complete output when the budget runs out.
struct ClosingRun {
  std::string text;
  bool complete = false;
};

ClosingRun run_to_budget(ConstraintKind kind, const std::string& spec_text, int budget, uint32_t seed) {
  auto c = start(kind, spec_text);
  std::mt19937 rng(seed);
  const std::vector<std::string_view> openers = {"{", "[", "{\"", "[[", "\"", ",", ":", "\\", "-", "<", "[{\"", "\":\""};
  std::vector<int32_t> ids, choices;
  auto pick = [&](const uint32_t* mask) {
    choices.clear();
    for (std::string_view o : openers)
      if (auto id = tok().token_to_id(o); id && allowed(mask, *id)) choices.push_back(*id);
    if (choices.empty() || rng() % 4 == 0) {
      choices.clear();
      for (int32_t id = 0; id < kVocab; ++id)
        if (allowed(mask, id) && id != eos()) choices.push_back(id);
    }
    if (choices.empty()) return eos();
    return choices[rng() % choices.size()];
  };
  for (int n = 0; n < budget && !c->terminated(); ++n) {
    const uint32_t* mask = c->next_token_mask();
    int32_t token = pick(mask);
    if (const uint32_t* narrowed = c->mask_to_finish_within(token, budget - n - 1)) {
      choices.clear();
      for (int32_t id = 0; id < kVocab; ++id)
        if (allowed(narrowed, id)) choices.push_back(id);
      if (choices.empty()) ADD_FAILURE() << "an empty narrowed mask";
      token = choices.empty() ? token : choices[rng() % choices.size()];
    }
    if (!c->accept_token(token)) {
      ADD_FAILURE() << "token " << token << " refused";
      break;
    }
    if (token != eos()) ids.push_back(token);
  }
  ClosingRun run;
  run.complete = c->terminated() || allowed(c->next_token_mask(), eos());
  run.text = *tok().decode(ids);
  return run;
}

TEST(GrammarEngine, ClosingCompletesJsonObjectsUnderEveryBudget) {
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    const int budget = 3 + static_cast<int>(seed * 7 % 60);
    const ClosingRun run = run_to_budget(ConstraintKind::kJson, "", budget, seed);
    EXPECT_TRUE(run.complete) << "seed " << seed << ": " << run.text;
    // accept(): the syntax only (a number such as -171e519 is valid JSON that parse() refuses as a double).
    EXPECT_TRUE(nlohmann::json::accept(run.text)) << "seed " << seed << ": " << run.text;
  }
}

TEST(GrammarEngine, ClosingCompletesSchemasRegexesAndToolCalls) {
  const std::string schema =
      R"({"type":"object","properties":{"name":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}},)"
      R"("n":{"type":"integer"}},"required":["name","tags","n"],"additionalProperties":false})";
  const std::string regex = R"((yes|no): [a-z]+( [a-z]+)* [0-9]+\.)";
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    ClosingRun run = run_to_budget(ConstraintKind::kJson, schema, 40 + static_cast<int>(seed * 11 % 50), seed);
    EXPECT_TRUE(run.complete) << "schema, seed " << seed << ": " << run.text;
    nlohmann::json value;
    EXPECT_NO_THROW(value = nlohmann::json::parse(run.text)) << run.text;
    EXPECT_TRUE(value.is_object() && value.contains("name") && value.contains("tags") && value.contains("n")) << run.text;
    run = run_to_budget(ConstraintKind::kRegex, regex, 12 + static_cast<int>(seed * 5 % 30), seed);
    EXPECT_TRUE(run.complete) << "regex, seed " << seed << ": " << run.text;
    EXPECT_TRUE(std::regex_match(run.text, std::regex(regex))) << run.text;
    run = run_to_budget(ConstraintKind::kToolCallRequired, kTools, 110 + static_cast<int>(seed * 13 % 60), seed);
    EXPECT_TRUE(run.complete) << "tool call, seed " << seed << ": " << run.text;
    EXPECT_TRUE(run.text.ends_with("</｜DSML｜ calls>")) << run.text;
  }
}

TEST(GrammarEngine, BadPatternsAndSchemasAreInvalidArgument) {
  ConstraintSpec regex{ConstraintKind::kRegex, "(", false, false};
  auto r = engine().start(regex);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  ConstraintSpec schema{ConstraintKind::kJson, "{not json", false, false};
  auto s = engine().start(schema);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  ConstraintSpec tools{ConstraintKind::kToolCall, "[]", false, false};
  EXPECT_FALSE(engine().start(tools).ok());
}

}  // namespace
}  // namespace cedar::constrain
