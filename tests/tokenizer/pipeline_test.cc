// The parts of the tokenizer.json pipeline DeepSeek's files do not use (normalisers, every Split
// behaviour, Digits/Whitespace/Punctuation, added-token flags, templates, a character-level BPE
// with byte fallback), against Hugging Face on small synthetic tokenizers
// (tools/tokenizer/gen_tokenizer_vectors.py writes them and the expectations).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer_test_util.h"

namespace cedar::tokenizer {
namespace {

using json = nlohmann::json;

TEST(Pipeline, SyntheticTokenizersMatchHuggingFace) {
  std::map<std::string, std::unique_ptr<Tokenizer>> tokenizers;
  std::ifstream in(data_dir() + "/pipeline_cases.jsonl");
  ASSERT_TRUE(in);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    const json row = json::parse(line);
    const std::string name = row["tokenizer"].get<std::string>();
    if (!tokenizers.count(name)) {
      auto t = Tokenizer::load(data_dir() + "/pipeline/" + name + ".json");
      ASSERT_TRUE(t.ok()) << name << ": " << t.status().to_string();
      tokenizers[name] = std::move(t).value();
    }
    const Tokenizer& tok = *tokenizers[name];
    const std::string text = row["text"].get<std::string>();
    auto ids = tok.encode(text, false);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    EXPECT_EQ(*ids, row["ids"].get<std::vector<TokenId>>()) << name << " text: " << text;
    auto ids_special = tok.encode(text, true);
    ASSERT_TRUE(ids_special.ok());
    EXPECT_EQ(*ids_special, row["ids_special"].get<std::vector<TokenId>>()) << name << " text: " << text;
    auto decoded = tok.decode(row["ids"].get<std::vector<TokenId>>(), false);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, row["decoded"].get<std::string>()) << name << " text: " << text;
    auto decoded_skip = tok.decode(row["ids_special"].get<std::vector<TokenId>>(), true);
    ASSERT_TRUE(decoded_skip.ok());
    EXPECT_EQ(*decoded_skip, row["decoded_skip_special"].get<std::string>()) << name << " text: " << text;
    ++n;
  }
  EXPECT_GE(n, 200);
  EXPECT_GE(tokenizers.size(), 17u);
}

}  // namespace
}  // namespace cedar::tokenizer
