// Encoding and decoding of the DeepSeek-V3 tokenizer of ../shared against the golden vectors that
// Hugging Face's Rust tokenizer produced (../shared/tokenizers/deepseek-v3/vectors.jsonl). Optional:
// both live only in ../shared; the repository's V4 tokenizer is checked against Hugging Face in
// corpus_test.cc.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace cedar::tokenizer {
namespace {

TEST(SharedVectors, EncodeAndDecodeMatchHuggingFace) {
  CEDAR_SKIP_WITHOUT_SHARED("tokenizers/deepseek-v3/vectors.jsonl");
  CEDAR_SKIP_WITHOUT_SHARED(kV3TokenizerFile);
  const Tokenizer& tok = v3_tokenizer();
  std::ifstream in(v3_tokenizer_dir() + "/vectors.jsonl");
  ASSERT_TRUE(in) << "missing shared vectors";
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto v = nlohmann::json::parse(line);
    const std::string text = v["text"].get<std::string>();
    auto ids = tok.encode(text, false);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    EXPECT_EQ(*ids, v["ids"].get<std::vector<TokenId>>()) << "text: " << text;
    auto decoded = tok.decode(v["ids"].get<std::vector<TokenId>>(), false);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, v["decoded"].get<std::string>());
    ++n;
  }
  EXPECT_GE(n, 50);
}

}  // namespace
}  // namespace cedar::tokenizer
