// add_v41_markers: the repository's V4-series tokenizer (the one test checkpoints ship) and,
// optionally, the DeepSeek-V3 one of ../shared gain V4.1's control markers as single tokens without
// disturbing anything else (ids, encodings, the Engram class layout). Expected encodings and Engram
// classes are Hugging Face's (tests/tokenizer/data, tools/tokenizer/), never cedar's.
#include "tokenizer/marker_tokens.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_encoding.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer_test_util.h"

namespace cedar::tokenizer {
namespace {

using chat::ChatOptions;
using chat::ChatPrompt;
using chat::encode_chat;
using chat::encode_chat_ids;
using chat::PromptFormat;

std::string v4_json() { return read_zst_file(v4_tokenizer_dir() + "/tokenizer.json.zst"); }
std::string v4_config() { return read_test_file(v4_tokenizer_dir() + "/tokenizer_config.json"); }
std::string v3_json() { return read_test_file(v3_tokenizer_dir() + "/tokenizer.json"); }
std::string v3_config() { return read_test_file(v3_tokenizer_dir() + "/tokenizer_config.json"); }

std::unique_ptr<Tokenizer> with_markers(const std::string& json, const std::string& config,
                                        std::vector<std::string>* added = nullptr) {
  auto text = add_v41_markers(json, added);
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  return load_or_die(Tokenizer::from_json(text.ok() ? *text : json, config), "tokenizer with markers");
}

ChatPrompt system_prompt() {
  ChatOptions o;
  auto prompt = encode_chat(nlohmann::ordered_json::parse(R"([{"role":"system","content":"Be brief."},
                                                              {"role":"user","content":"hi"}])"), o);
  EXPECT_TRUE(prompt.ok()) << prompt.status().to_string();
  return prompt.ok() ? *prompt : ChatPrompt{};
}

// Every V4.1 marker encodes to its one id and decodes back.
void expect_single_token_markers(const Tokenizer& tok) {
  for (std::string_view m : v41_marker_tokens()) {
    auto id = tok.token_to_id(m);
    ASSERT_TRUE(id.has_value()) << m;
    auto enc = tok.encode(m);
    ASSERT_TRUE(enc.ok());
    EXPECT_EQ(*enc, std::vector<TokenId>{*id}) << m << " must encode to its one id";
    auto dec = tok.decode(*enc);
    ASSERT_TRUE(dec.ok());
    EXPECT_EQ(*dec, m);
  }
}

// The premise (the V4.1 encoder refuses the plain file), then the file with markers: a system prompt
// encodes, every marker is one token, <｜System｜> takes V4.1's id and <｜User｜> keeps the plain
// file's. Returns the markers added.
std::vector<std::string> check_markers_make_v41_encodable(const Tokenizer& plain, const std::string& json,
                                                          const std::string& config) {
  const ChatPrompt prompt = system_prompt();
  EXPECT_FALSE(encode_chat_ids(plain, prompt, PromptFormat::kV41).ok());
  std::vector<std::string> added;
  auto tok = with_markers(json, config, &added);
  auto ids = encode_chat_ids(*tok, prompt, PromptFormat::kV41);
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  expect_single_token_markers(*tok);
  EXPECT_EQ(*tok->token_to_id("<｜System｜>"), 128799);  // V4.1's own id for it
  EXPECT_EQ(*tok->token_to_id("<｜User｜>"), *plain.token_to_id("<｜User｜>"));
  return added;
}

TEST(MarkerTokens, V4LacksSystemUntilAdded) {
  // id 128799 is a placeholder in the V4-series file.
  EXPECT_EQ(check_markers_make_v41_encodable(v4_tokenizer(), v4_json(), v4_config()),
            (std::vector<std::string>{"<｜System｜>=128799", "<｜deepseek_image｜>=129264"}));
}

TEST(MarkerTokens, V4EverythingElseIsUnchanged) {
  auto tok = with_markers(v4_json(), v4_config());
  EXPECT_EQ(tok->vocab_size(), v4_tokenizer().vocab_size());
  // Ordinary text encodes as Hugging Face encodes the plain file (random_strings.jsonl, key v4),
  // except texts that spell a renamed token (those encode differently now, as they should).
  std::vector<std::string> renamed = {"<｜deepseek_image｜>"};
  for (std::string_view m : v41_marker_tokens()) renamed.emplace_back(m);
  for (TokenId id : {128799, 129264}) renamed.emplace_back(*v4_tokenizer().id_to_token(id));
  std::ifstream in(data_dir() + "/random_strings.jsonl");
  ASSERT_TRUE(in);
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    auto v = nlohmann::json::parse(line);
    const std::string text = v["text"].get<std::string>();
    bool has_renamed = false;
    for (const std::string& m : renamed) has_renamed |= text.find(m) != std::string::npos;
    if (has_renamed) continue;
    auto ids = tok->encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, v["v4"].get<std::vector<TokenId>>()) << v["text"];
    ++checked;
  }
  EXPECT_GT(checked, 250) << "most of the 500 strings must be free of renamed tokens";
  // The Engram classes of every id keep their numbers: the reference's array for the plain file
  // (engram_map.json, key v4; test checkpoints' configs and goldens depend on the class layout).
  const auto e = nlohmann::json::parse(read_test_file(data_dir() + "/engram_map.json"))["v4"];
  int n = 0;
  const auto map = build_engram_token_map(*tok, &n);
  EXPECT_EQ(n, e["n_classes"].get<int>());
  ASSERT_EQ(map.size(), e["vocab_size"].get<size_t>());
  EXPECT_EQ(ids_digest(map.data(), map.size()), e["xxh64"].get<std::string>());
}

TEST(MarkerTokens, V3LacksMarkersUntilAdded) {
  CEDAR_SKIP_WITHOUT_SHARED(kV3TokenizerFile);
  // System, <think>, </think>, DSML, latest_reminder.
  EXPECT_EQ(check_markers_make_v41_encodable(v3_tokenizer(), v3_json(), v3_config()).size(), 5u);
}

TEST(MarkerTokens, V3EverythingElseIsUnchanged) {
  CEDAR_SKIP_WITHOUT_SHARED("tokenizers/deepseek-v3/vectors.jsonl");
  auto tok = with_markers(v3_json(), v3_config());
  EXPECT_EQ(tok->vocab_size(), v3_tokenizer().vocab_size());
  // Ordinary text encodes as before (the shared Hugging Face vectors).
  std::ifstream in(v3_tokenizer_dir() + "/vectors.jsonl");
  std::string line;
  int checked = 0;
  while (std::getline(in, line) && checked < 200) {
    auto v = nlohmann::json::parse(line);
    const std::string text = v["text"].get<std::string>();
    bool has_marker = false;  // those texts encode differently now, as they should
    for (std::string_view m : v41_marker_tokens()) has_marker |= text.find(m) != std::string::npos;
    if (has_marker) continue;
    auto ids = tok->encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, v["ids"].get<std::vector<TokenId>>()) << v["text"];
    ++checked;
  }
  EXPECT_GT(checked, 0);
  // The Engram classes of every id keep their numbers (test checkpoints' configs and goldens
  // depend on the class layout).
  int n_old = 0, n_new = 0;
  const auto old_map = build_engram_token_map(v3_tokenizer(), &n_old);
  const auto new_map = build_engram_token_map(*tok, &n_new);
  EXPECT_EQ(n_new, n_old);
  EXPECT_EQ(new_map, old_map);
}

TEST(MarkerTokens, IdempotentAndRefusesWhatItCannotFix) {
  auto once = add_v41_markers(v4_json());
  ASSERT_TRUE(once.ok());
  auto twice = add_v41_markers(*once);
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ(*twice, *once);

  EXPECT_EQ(add_v41_markers("{not json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(add_v41_markers(R"({"added_tokens": 3})").status().code(), StatusCode::kInvalidArgument);
  // A vocabulary with no placeholders left cannot take the markers.
  const std::string bare = R"({"added_tokens": [{"id": 0, "content": "<x>"}], "model": {"vocab": {"a": 1}}})";
  auto r = add_v41_markers(bare);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("V4.1 tokenizer.json"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace cedar::tokenizer
