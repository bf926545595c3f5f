// The Engram compressed token map against the reference's normaliser chain run by the pinned
// Hugging Face `tokenizers` (tools/tokenizer/gen_engram_map.py): the V4 tokenizer's classes (digests
// per 4,096 ids) and class count, which must be the 99,092 that DeepSeek-V4.1 asserts, and (optional,
// where ../shared has the DeepSeek-V3 tokenizer) the whole V3 class array.
#include "tokenizer/engram_token_map.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer_test_util.h"

namespace cedar::tokenizer {
namespace {

using json = nlohmann::json;

std::string digest_of(const std::vector<int32_t>& v, size_t begin, size_t end) {
  return ids_digest(v.data() + begin, end - begin);
}

void check_against_oracle(const Tokenizer& tok, const json& e, const std::string& name) {
  int n_classes = 0;
  const std::vector<int32_t> map = build_engram_token_map(tok, &n_classes);
  ASSERT_EQ(map.size(), e["vocab_size"].get<size_t>()) << name;
  EXPECT_EQ(n_classes, e["n_classes"].get<int>()) << name;
  for (size_t b = 0; b < e["blocks"].size(); ++b) {
    const size_t begin = b * 4096, end = std::min(map.size(), begin + 4096);
    EXPECT_EQ(digest_of(map, begin, end), e["blocks"][b].get<std::string>())
        << name << ": classes differ from the reference in ids " << begin << ".." << end;
  }
  EXPECT_EQ(digest_of(map, 0, map.size()), e["xxh64"].get<std::string>()) << name;
}

TEST(EngramTokenMap, V3MatchesReferenceArray) {
  CEDAR_SKIP_WITHOUT_SHARED(kV3TokenizerFile);
  const json expected = json::parse(read_test_file(data_dir() + "/engram_map.json"));
  check_against_oracle(v3_tokenizer(), expected["v3"], "v3");
  // The committed array itself, for a readable first difference.
  const std::string packed = read_zst_file(data_dir() + "/engram_map_v3.i32.zst");
  std::vector<int32_t> ref(packed.size() / 4);
  std::memcpy(ref.data(), packed.data(), packed.size());
  int n = 0;
  const auto map = build_engram_token_map(v3_tokenizer(), &n);
  ASSERT_EQ(map.size(), ref.size());
  for (size_t i = 0; i < map.size(); ++i) {
    if (map[i] != ref[i]) {
      ADD_FAILURE() << "first difference at id " << i << " (" << *v3_tokenizer().id_to_token(static_cast<TokenId>(i))
                    << "): class " << map[i] << ", reference " << ref[i];
      break;
    }
  }
}

TEST(EngramTokenMap, V4HasTheV41ClassCount) {
  const json expected = json::parse(read_test_file(data_dir() + "/engram_map.json"));
  check_against_oracle(v4_tokenizer(), expected["v4"], "v4");
  int n = 0;
  build_engram_token_map(v4_tokenizer(), &n);
  EXPECT_EQ(n, kV41EngramClasses);
}

TEST(EngramTokenMap, NormalisationChainByHand) {
  EXPECT_EQ(engram_normalize(" The"), "the");
  EXPECT_EQ(engram_normalize("THE"), "the");
  EXPECT_EQ(engram_normalize("Café"), "cafe");
  EXPECT_EQ(engram_normalize("ﬁ"), "fi");          // NFKC ligature
  EXPECT_EQ(engram_normalize(" "), " ");           // a lone space survives Strip
  EXPECT_EQ(engram_normalize("\n\t"), " ");        // collapses to one space, then protected
  EXPECT_EQ(engram_normalize("  a \n b  "), "a b");
  EXPECT_EQ(engram_normalize("\u0301"), "");       // only a combining mark: empty (key = text)
  EXPECT_EQ(engram_normalize("İ"), "i");           // İ -> I + dot (NFD), dot stripped, lowercase
}

}  // namespace
}  // namespace cedar::tokenizer
