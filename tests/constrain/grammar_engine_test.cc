// The constrained-decoding glue over xgrammar (constrain/grammar_engine.h), on the repository's
// DeepSeek-V4-series tokenizer: masks from compiled grammars, accept, termination, reset, the
// thinking gate, the DSML tool-call grammar. Expected behaviour is stated from the grammars and the
// tokenizer's own encodings, never from the code under test.
#include "constrain/grammar_engine.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"

namespace cedar::constrain {
namespace {

const tokenizer::Tokenizer& tok() {
  static const std::unique_ptr<tokenizer::Tokenizer> t = [] {
    auto r = tokenizer::load_with_v41_markers(std::string(CEDAR_SOURCE_DIR) + "/data/tokenizers/deepseek-v4");
    if (!r.ok()) throw std::runtime_error(r.status().to_string());
    return std::move(*r);
  }();
  return *t;
}

// The model's logits are wider than the tokenizer's vocabulary (V4: 129,280 ids).
constexpr int kVocab = 129280;

GrammarEngine& engine() {
  static const std::unique_ptr<GrammarEngine> e = [] {
    auto r = GrammarEngine::create(tok(), kVocab);
    if (!r.ok()) throw std::runtime_error(r.status().to_string());
    return std::move(*r);
  }();
  return *e;
}

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
  EXPECT_EQ(c->next_token_mask(), nullptr) << "reasoning is not constrained";
  EXPECT_TRUE(c->accept_token(id_of("Whatever")));
  EXPECT_TRUE(c->accept_token(id_of("<think>")));
  EXPECT_TRUE(c->accept_token(id_of("</think>")));
  const uint32_t* mask = c->next_token_mask();
  ASSERT_NE(mask, nullptr);
  EXPECT_TRUE(allowed(mask, id_of("yes")));
  EXPECT_FALSE(allowed(mask, id_of("Whatever")));
  c->reset();
  EXPECT_EQ(c->next_token_mask(), nullptr) << "reset goes back before </think>";
}

const std::string kTools =
    R"([{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}},{"name":"ping"}])";

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
