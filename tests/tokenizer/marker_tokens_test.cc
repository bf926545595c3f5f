// add_v41_markers: the V3 tokenizer test checkpoints ship gains V4.1's control markers as single
// tokens without disturbing anything else (ids, encodings, the Engram class layout).
#include "tokenizer/marker_tokens.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_encoding.h"
#include "tokenizer/engram_token_map.h"
#include "tokenizer_test_util.h"

namespace cedar::tokenizer {
namespace {

std::string v3_json() { return read_test_file(shared_dir() + "/tokenizers/deepseek-v3/tokenizer.json"); }
std::string v3_config() { return read_test_file(shared_dir() + "/tokenizers/deepseek-v3/tokenizer_config.json"); }

std::unique_ptr<Tokenizer> v3_with_markers(std::vector<std::string>* added = nullptr) {
  auto text = add_v41_markers(v3_json(), added);
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  return load_or_die(Tokenizer::from_json(text.ok() ? *text : v3_json(), v3_config()), "V3 with markers");
}

TEST(MarkerTokens, V3LacksMarkersUntilAdded) {
  // The premise: the V4.1 encoder refuses the plain V3 file.
  ChatOptions o;
  auto prompt = encode_chat(nlohmann::ordered_json::parse(R"([{"role":"system","content":"Be brief."},
                                                              {"role":"user","content":"hi"}])"), o);
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  EXPECT_FALSE(encode_chat_ids(v3_tokenizer(), *prompt, PromptFormat::kV41).ok());

  std::vector<std::string> added;
  auto tok = v3_with_markers(&added);
  EXPECT_EQ(added.size(), 5u);  // System, <think>, </think>, DSML, latest_reminder
  auto ids = encode_chat_ids(*tok, *prompt, PromptFormat::kV41);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  for (std::string_view m : v41_marker_tokens()) {
    auto id = tok->token_to_id(m);
    ASSERT_TRUE(id.has_value()) << m;
    auto enc = tok->encode(m);
    ASSERT_TRUE(enc.ok());
    EXPECT_EQ(*enc, std::vector<TokenId>{*id}) << m << " must encode to its one id";
    auto dec = tok->decode(*enc);
    ASSERT_TRUE(dec.ok());
    EXPECT_EQ(*dec, m);
  }
  EXPECT_EQ(*tok->token_to_id("<｜System｜>"), 128799);  // V4.1's own id for it
  EXPECT_EQ(*tok->token_to_id("<｜User｜>"), *v3_tokenizer().token_to_id("<｜User｜>"));
}

TEST(MarkerTokens, EverythingElseIsUnchanged) {
  auto tok = v3_with_markers();
  EXPECT_EQ(tok->vocab_size(), v3_tokenizer().vocab_size());
  // Ordinary text encodes as before (the shared Hugging Face vectors).
  std::ifstream in(shared_dir() + "/tokenizers/deepseek-v3/vectors.jsonl");
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
  auto once = add_v41_markers(v3_json());
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
