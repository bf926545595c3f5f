// What the DSML tool-call grammar lets a model write, the server's DSML parser must read back; what a
// JSON schema's grammar lets through, a strict JSON parser must take.
//
// Random walks through the grammar stand in for a model with random weights: at every step one
// token is drawn uniformly from those the grammar's mask allows (the end-of-sentence token, when
// allowed, with a fixed probability so that walks end). The ids go through the same pipeline the
// server uses: tokenizer::StreamDecoder to text, then chat::CompletionParser, fed the forced
// call's prefill first when the call is required, each token's text with its kind (special or
// ordinary: the parser matches the DSML marker only against its token, so the grammar must reach
// the marker only through it, GrammarEngine's SpelledMarkerTokens), and without the
// end-of-sentence token (the engine stops on it). The parser reads every text (deepseek-recipe's rules), so
// agreement means: every walk that ended reads as it was written, no DSML markup shows in the
// content, every invoke the walk wrote is a call, and every call carries JSON arguments of a
// declared tool. Uniform draws favour the
// odd tokens a trained model rarely writes (pieces of a multi-byte character, runs of white space),
// which is where grammar and parser could disagree.
#include <cctype>
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_encoding.h"
#include "chat/completion_parser.h"
#include "constrain/grammar_engine.h"
#include "tokenizer/marker_tokens.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"
#include "constrain_test_util.h"

namespace cedar::constrain {
namespace {

using test_util::kVocab;
using test_util::tok;
using test_util::engine;

// Two tools: enums, a bounded integer, a boolean, an array of enums, optional properties.
const char* kTools = R"([
 {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "metric": {"type": "boolean"}}, "required": ["city", "days"]}},
 {"name": "search_docs", "parameters": {"type": "object", "properties": {
    "topic": {"type": "string", "enum": ["news", "docs"]},
    "limit": {"type": "integer", "minimum": 1, "maximum": 50},
    "filters": {"type": "array", "items": {"type": "string", "enum": ["en", "fr"]}, "maxItems": 2}},
    "required": ["topic"]}}])";

// One tool whose raw string value is length-bounded (xgrammar local fix 2, cmake/Xgrammar.cmake).
const char* kBoundedTools = R"([
 {"name": "search_docs", "parameters": {"type": "object", "properties": {
    "query": {"type": "string", "minLength": 1, "maxLength": 5},
    "limit": {"type": "integer", "minimum": 1, "maximum": 50}},
    "required": ["query"]}}])";

struct Walk {
  std::string text;          // the decoded output
  bool ended = false;        // the grammar took the end-of-sentence token
  std::string content;       // what the parser reported as content and reasoning
  std::vector<chat::ToolCall> calls;
};

// Collects a parser's events into `content` and `calls`.
void take_events(const std::vector<chat::ParseEvent>& events, std::string* content,
                 std::vector<chat::ToolCall>* calls) {
  for (const auto& e : events) {
    if (e.type == chat::ParseEvent::Type::kToolCall) calls->push_back(e.tool_call);
    if (e.type == chat::ParseEvent::Type::kContentDelta || e.type == chat::ParseEvent::Type::kReasoningDelta)
      *content += e.text;
  }
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// Where the parser's reading of an ended walk disagrees with what the grammar let it write ("" when
// it agrees): markup shown as content, or an invoke that is no call.
std::string disagreement(const std::string& text, const std::string& content,
                         const std::vector<chat::ToolCall>& calls) {
  if (content.find(tokenizer::kDsml) != std::string::npos) return "DSML markup in the content: " + content;
  const size_t invokes = count_of(text, "<" + std::string(tokenizer::kDsml) + " invoke name=\"");
  if (invokes != calls.size())
    return std::to_string(invokes) + " invokes written, " + std::to_string(calls.size()) + " calls read";
  return "";
}

// The kind of the text `id` decoded to, as the output assembler tells the parser.
chat::ChunkKind kind_of(int32_t id) {
  for (const tokenizer::AddedToken& t : tok().added_tokens())
    if (t.id == id) return chat::ChunkKind::kSpecialToken;
  return chat::ChunkKind::kPlainTokens;
}

// One walk of at most `max_steps` tokens, parsed as the server's output assembler parses it.
Walk walk(ConstraintKind kind, uint32_t seed, int max_steps, const char* tools = kTools) {
  ConstraintSpec spec;
  spec.kind = kind;
  spec.text = tools;
  auto started = engine().start(spec);
  if (!started.ok()) throw std::runtime_error(started.status().to_string());
  GrammarConstraint& c = **started;
  std::mt19937 rng(seed);
  tokenizer::StreamDecoder decoder(tok());
  chat::CompletionParser parser(chat::ThinkingMode::kChat);
  Walk w;
  auto take = [&](const std::vector<chat::ParseEvent>& events) { take_events(events, &w.content, &w.calls); };
  // The required call's prefill is prompt text the parser reads first (serve/chat_prompt.h).
  if (kind == ConstraintKind::kToolCallRequired)
    take(parser.feed("\n\n<" + std::string(tokenizer::kDsml) + " calls>\n", chat::ChunkKind::kText));
  const int32_t eos = engine().eos_id();
  // Auto calls: uniform draws would almost never open a calls block, so the walk opens one with
  // the tokenizer's own encoding of a short answer and the block's start, then goes on at random.
  std::vector<int32_t> opening;
  if (kind == ConstraintKind::kToolCall) {
    auto ids = tok().encode("Let me check.\n\n<" + std::string(tokenizer::kDsml) + " calls>\n");
    if (!ids.ok()) throw std::runtime_error(ids.status().to_string());
    opening = *ids;
  }
  std::vector<int32_t> allowed;
  for (int step = 0; step < max_steps && !w.ended; ++step) {
    const uint32_t* mask = c.next_token_mask();
    allowed.clear();
    bool eos_allowed = false;
    for (int id = 0; id < kVocab; ++id) {
      if (mask != nullptr && !((mask[id / 32] >> (id % 32)) & 1u)) continue;
      if (id == eos) eos_allowed = true;
      else allowed.push_back(id);
    }
    int32_t next;
    if (static_cast<size_t>(step) < opening.size()) {
      next = opening[static_cast<size_t>(step)];
    } else if (eos_allowed && (allowed.empty() || std::uniform_real_distribution<double>(0, 1)(rng) < 0.3)) {
      next = eos;
    } else {
      if (allowed.empty()) throw std::runtime_error("the grammar allows no token");
      next = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    }
    if (!c.accept_token(next)) throw std::runtime_error("the grammar refused a token its mask allowed");
    w.ended = next == eos;
    if (w.ended) break;  // the engine stops on it: never parsed
    auto piece = decoder.push(next);
    if (!piece.ok()) throw std::runtime_error(piece.status().to_string());
    w.text += *piece;
    take(parser.feed(*piece, kind_of(next)));
  }
  const std::string tail = decoder.finish();
  w.text += tail;
  take(parser.feed(tail, chat::ChunkKind::kPlainTokens));
  if (w.ended) take(parser.finish());
  return w;
}

std::string escaped(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

void check_walks(ConstraintKind kind, int walks, int min_calls, const char* tools_text = kTools) {
  const auto tools = nlohmann::json::parse(tools_text);
  int ended = 0, calls = 0, queries = 0;
  for (int i = 0; i < walks; ++i) {
    const Walk w = walk(kind, 1000u + static_cast<uint32_t>(i), 400, tools_text);
    if (!w.ended) continue;  // a walk the step bound cut: its text is unfinished by nature
    ++ended;
    ASSERT_EQ(disagreement(w.text, w.content, w.calls), "") << "walk " << i << " wrote " << escaped(w.text);
    for (const auto& call : w.calls) {
      ++calls;
      bool declared = false;
      for (const auto& t : tools) {
        if (t["name"] == call.name) declared = true;
      }
      EXPECT_TRUE(declared) << call.name;
      const auto args = nlohmann::json::parse(call.arguments, nullptr, false);
      EXPECT_TRUE(args.is_object()) << "walk " << i << ": " << call.arguments << " from " << escaped(w.text);
      // A raw value under a length bound (xgrammar local fix 2, cmake/Xgrammar.cmake): counted in
      // code points, as JSON Schema counts.
      if (args.is_object() && args.contains("query") && args["query"].is_string()) {
        ++queries;
        size_t length = 0;
        for (unsigned char ch : args["query"].get<std::string>()) length += (ch & 0xC0) != 0x80;
        EXPECT_GE(length, 1u) << "walk " << i << ": " << call.arguments;
        EXPECT_LE(length, 5u) << "walk " << i << ": " << call.arguments;
      }
    }
    EXPECT_FALSE(w.calls.empty()) << escaped(w.text);  // required, or a block the walk opened
  }
  // The walks must have exercised the grammar: most end, and they make calls.
  EXPECT_GE(ended, walks / 2);
  EXPECT_GE(calls, min_calls);
  if (tools_text == kBoundedTools) EXPECT_GE(queries, min_calls) << "every call holds the bounded query";
}

TEST(GrammarParserAgreement, RequiredToolCallsParse) { check_walks(ConstraintKind::kToolCallRequired, 150, 150); }

TEST(GrammarParserAgreement, AutoToolCallsParse) { check_walks(ConstraintKind::kToolCall, 150, 150); }

TEST(GrammarParserAgreement, LengthBoundedRawStringsParse) {
  check_walks(ConstraintKind::kToolCallRequired, 100, 100, kBoundedTools);
}

// Free text beside auto tool calls: read by spelling, "<｜DSML｜" in content opens the tool calls
// wherever it stands, so the grammar must refuse the marker anywhere but in the calls block it
// opens after a blank line, "\n\n<｜DSML｜ calls>" (what the chat template writes). A sampled model found the hole (a calls block
// opened without the blank line before it was a 500); uniform walks almost never draw the marker,
// so these walks draw the tokens around it often.
TEST(GrammarParserAgreement, FreeTextNeverHoldsAStrayDsmlMarker) {
  ConstraintSpec spec;
  spec.kind = ConstraintKind::kToolCall;
  spec.text = kTools;
  const int32_t dsml = *tok().token_to_id(tokenizer::kDsml);
  std::vector<int32_t> lures = {dsml};
  for (const char* piece : {"<", "</", "\n", "\n\n", " calls", ">", ">\n", "ok", " invoke"}) {
    const auto ids = tok().encode(piece);
    ASSERT_TRUE(ids.ok());
    lures.insert(lures.end(), ids->begin(), ids->end());
  }
  const auto allows = [](const uint32_t* mask, int32_t id) { return mask == nullptr || ((mask[id / 32] >> (id % 32)) & 1u); };
  // The mask itself, after a few prefixes.
  for (const auto& [prefix, want] : std::vector<std::pair<std::string, bool>>{
           {"", false}, {"Hello", false}, {"Hello<", false}, {"Hello\n<", false}, {"Hello\n\n", false},
           {"Hello\n\n<", true}, {"\n\n<", true}}) {
    auto started = engine().start(spec);
    ASSERT_TRUE(started.ok());
    GrammarConstraint& c = **started;
    if (!prefix.empty()) {
      const auto ids = tok().encode(prefix);
      ASSERT_TRUE(ids.ok());
      for (int32_t id : *ids) {
        c.next_token_mask();
        ASSERT_TRUE(c.accept_token(id)) << escaped(prefix);
      }
    }
    EXPECT_EQ(allows(c.next_token_mask(), dsml), want) << "after " << escaped(prefix);
  }
  // The end-of-sentence marker spelled by ordinary tokens: the parser would read it as the end.
  {
    auto started = engine().start(spec);
    ASSERT_TRUE(started.ok());
    GrammarConstraint& c = **started;
    const auto ids = tok().encode("Hi <");
    ASSERT_TRUE(ids.ok());
    for (int32_t id : *ids) {
      c.next_token_mask();
      ASSERT_TRUE(c.accept_token(id));
    }
    // The rest of the marker as ordinary tokens (without its "<" it is plain text to the
    // tokenizer): one of them, at the latest the one that completes it, must be refused.
    const auto rest = tok().encode(std::string(tokenizer::kEos).substr(1));
    ASSERT_TRUE(rest.ok());
    bool refused = false;
    for (int32_t id : *rest) {
      if (!allows(c.next_token_mask(), id)) {
        refused = true;
        break;
      }
      ASSERT_TRUE(c.accept_token(id));
    }
    EXPECT_TRUE(refused) << "free text may spell the end-of-sentence marker";
  }
  // Walks that draw the lures half of the time: no walk may make the parser complain.
  int calls = 0, ended = 0, marker_walks = 0;
  std::vector<int32_t> allowed, lures_allowed;
  for (uint32_t seed = 0; seed < 200; ++seed) {
    auto started = engine().start(spec);
    ASSERT_TRUE(started.ok());
    GrammarConstraint& c = **started;
    std::mt19937 rng(seed);
    tokenizer::StreamDecoder decoder(tok());
    chat::CompletionParser parser(chat::ThinkingMode::kChat);
    std::string text, content;
    std::vector<chat::ToolCall> walk_calls;
    bool done = false, saw_marker = false;
    const auto take = [&](const std::vector<chat::ParseEvent>& events) {
      take_events(events, &content, &walk_calls);
    };
    for (int step = 0; step < 120 && !done; ++step) {
      const uint32_t* mask = c.next_token_mask();
      allowed.clear();
      lures_allowed.clear();
      for (int id = 0; id < kVocab; ++id)
        if (allows(mask, id)) allowed.push_back(id);
      for (int32_t id : lures)
        if (allows(mask, id)) lures_allowed.push_back(id);
      ASSERT_FALSE(allowed.empty());
      const bool lure = !lures_allowed.empty() && std::uniform_real_distribution<double>(0, 1)(rng) < 0.5;
      const auto& pool = lure ? lures_allowed : allowed;
      const int32_t next = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
      ASSERT_TRUE(c.accept_token(next));
      if (next == dsml) saw_marker = true;
      if (next == engine().eos_id()) {
        done = true;
        ++ended;
        break;
      }
      auto piece = decoder.push(next);
      ASSERT_TRUE(piece.ok());
      text += *piece;
      take(parser.feed(*piece, kind_of(next)));
    }
    marker_walks += saw_marker;
    if (!done) continue;  // a walk the step bound cut: its text is unfinished by nature
    take(parser.finish());
    ASSERT_EQ(disagreement(text, content, walk_calls), "") << "walk " << seed << " wrote " << escaped(text);
    // The grammar keeps the other marker spellings out of the free text too.
    for (const std::string_view marker : {tokenizer::kThinkStart, tokenizer::kThinkEnd, tokenizer::kBos, tokenizer::kEos})
      EXPECT_EQ(count_of(text, std::string(marker)), 0u) << "walk " << seed << " wrote " << escaped(text);
    calls += static_cast<int>(walk_calls.size());
  }
  EXPECT_GT(ended, 0);
  EXPECT_GE(marker_walks, 3) << "the walks must reach the DSML marker (after the blank line) to test anything";
  RecordProperty("calls", calls);
}

// The DSML marker is structural only right after "<" or "</": there the ordinary tokens that begin
// like it are refused (the parser would read them as text), elsewhere they stay allowed, so a string
// value can hold "｜" (which no other token spells).
TEST(GrammarParserAgreement, SpelledMarkerPiecesAreRefusedOnlyAfterATagOpening) {
  ConstraintSpec spec;
  spec.kind = ConstraintKind::kToolCallRequired;
  spec.text = R"([{"name": "note", "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"]}}])";
  auto started = engine().start(spec);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  GrammarConstraint& c = **started;
  const auto allows = [&](int32_t id) {
    const uint32_t* mask = c.next_token_mask();
    return mask == nullptr || ((mask[id / 32] >> (id % 32)) & 1u);
  };
  const auto accept = [&](const std::string& text) {
    const auto ids = tok().encode(text);
    ASSERT_TRUE(ids.ok());
    for (int32_t id : *ids) {
      c.next_token_mask();
      ASSERT_TRUE(c.accept_token(id)) << "the grammar refused " << escaped(text);
    }
  };
  const auto bar = tok().encode("｜");
  ASSERT_TRUE(bar.ok());
  ASSERT_EQ(bar->size(), 1u) << "the V4 vocabulary spells U+FF5C with one token";
  const int32_t fullwidth_bar = bar->front();
  const int32_t dsml = *tok().token_to_id(tokenizer::kDsml);
  const std::string m(tokenizer::kDsml);
  accept("<" + m + " invoke name=\"note\">\n<" + m + " parameter name=\"text\" string=\"true\">");
  EXPECT_TRUE(allows(fullwidth_bar)) << "inside a string value";
  accept("a");
  EXPECT_TRUE(allows(fullwidth_bar)) << "after a letter in the value";
  accept("<");
  EXPECT_TRUE(allows(dsml));
  EXPECT_FALSE(allows(fullwidth_bar)) << "after \"<\", where the marker token is allowed";
  accept("b</");
  EXPECT_TRUE(allows(dsml));
  EXPECT_FALSE(allows(fullwidth_bar)) << "after \"</\"";
  // The parser ends the value at "</" + the marker token, so after it only the parameter's own end fits.
  c.next_token_mask();
  ASSERT_TRUE(c.accept_token(dsml));
  const auto invoke_end = tok().encode(" invoke>");
  const auto parameter_end = tok().encode(" parameter>");
  ASSERT_TRUE(invoke_end.ok() && parameter_end.ok());
  EXPECT_FALSE(allows(invoke_end->front())) << "a value holding \"</｜DSML｜ invoke>\"";
  EXPECT_TRUE(allows(parameter_end->front()));
}

// JSON schemas: every walk that ended is JSON a strict parser takes (no raw control characters in
// strings) with the schema's bounds. xgrammar 0.2.9 let raw control characters into strings with
// minLength/maxLength (fixed locally in cmake/Xgrammar.cmake); a tab there broke a sample.
// True when `text` ends with `"name"`, a colon and the opening quote of its value, with any white
// space around the colon (the grammar allows any).
bool opens_name_string(const std::string& text) {
  size_t i = text.size();
  if (i == 0 || text[--i] != '"') return false;
  while (i > 0 && std::isspace(static_cast<unsigned char>(text[i - 1]))) --i;
  if (i == 0 || text[--i] != ':') return false;
  while (i > 0 && std::isspace(static_cast<unsigned char>(text[i - 1]))) --i;
  return i >= 6 && text.compare(i - 6, 6, "\"name\"") == 0;
}

TEST(JsonSchemaWalks, BoundedStringsAndNumbersStayValidJson) {
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 6},
      "code": {"type": "string", "minLength": 2, "maxLength": 3},
      "flag": {"type": "boolean"},
      "count": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["name", "code", "flag", "count"], "additionalProperties": false})";
  ConstraintSpec spec;
  spec.kind = ConstraintKind::kJson;
  spec.text = schema;
  spec.strict = true;
  const int32_t eos = engine().eos_id();
  const auto tab = tok().encode("\t");
  ASSERT_TRUE(tab.ok() && tab->size() == 1u);
  int ended = 0, tab_checks = 0;
  for (uint32_t seed = 0; seed < 120; ++seed) {
    auto started = engine().start(spec);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    GrammarConstraint& c = **started;
    std::mt19937 rng(seed);
    tokenizer::StreamDecoder decoder(tok());
    std::string text;
    bool done = false;
    bool in_bounded_string = false;  // just after `"name": "` (checked once per walk below)
    std::vector<int32_t> allowed;
    for (int step = 0; step < 300 && !done; ++step) {
      const uint32_t* mask = c.next_token_mask();
      allowed.clear();
      bool eos_allowed = false;
      for (int id = 0; id < kVocab; ++id) {
        if (mask != nullptr && !((mask[id / 32] >> (id % 32)) & 1u)) continue;
        if (id == eos) eos_allowed = true;
        else allowed.push_back(id);
      }
      if (in_bounded_string) {
        EXPECT_FALSE(mask == nullptr || ((mask[(*tab)[0] / 32] >> ((*tab)[0] % 32)) & 1u))
            << "a raw tab is allowed inside a maxLength string";
        in_bounded_string = false;
        ++tab_checks;
      }
      int32_t next;
      if (eos_allowed && (allowed.empty() || std::uniform_real_distribution<double>(0, 1)(rng) < 0.5)) {
        next = eos;
      } else {
        ASSERT_FALSE(allowed.empty());
        next = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      }
      ASSERT_TRUE(c.accept_token(next));
      if (next == eos) {
        done = true;
        break;
      }
      auto piece = decoder.push(next);
      ASSERT_TRUE(piece.ok());
      text += *piece;
      if (opens_name_string(text)) in_bounded_string = true;
    }
    if (!done) continue;
    text += decoder.finish();
    ++ended;
    const auto value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(value.is_discarded()) << "walk " << seed << " wrote " << escaped(text);
    ASSERT_TRUE(value.is_object());
    const auto length = [](const std::string& s) {  // code points
      size_t n = 0;
      for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
      return n;
    };
    EXPECT_LE(length(value["name"].get<std::string>()), 6u) << escaped(text);
    EXPECT_GE(length(value["code"].get<std::string>()), 2u) << escaped(text);
    EXPECT_LE(length(value["code"].get<std::string>()), 3u) << escaped(text);
    EXPECT_TRUE(value["count"].is_number_integer());
    EXPECT_GE(value["count"].get<int64_t>(), 0);
    EXPECT_LE(value["count"].get<int64_t>(), 999);
  }
  EXPECT_GE(ended, 60);
  EXPECT_GT(tab_checks, 0) << "no walk reached the start of the bounded string: the mask check never ran";
}

}  // namespace
}  // namespace cedar::constrain
