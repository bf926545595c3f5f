// The Engram compressed token map (spec §4.3): every token id is mapped to a class shared by the
// tokens whose text normalises alike (" The", "the" and "THE" collapse), so that Engram's n-gram
// hashes ignore case, accents and spacing. The reference builds it with Hugging Face normalisers:
//
//   text = raw single-id decode (Tokenizer::decode_token_raw)
//   if text contains U+FFFD (a partial UTF-8 byte token): key = the raw vocabulary string
//   else key = normalise(text), or text itself when that is empty, where normalise is
//     NFKC -> NFD -> strip combining marks -> per-char lowercase -> runs of [ \t\r\n] -> " "
//     -> a text that is exactly " " is protected (U+E000) -> strip White_Space -> U+E000 -> " "
//   classes are numbered in order of first appearance over ids 0..vocab_size-1.
//
// For DeepSeek-V4.1 the class count must be 99,092 (the reference asserts it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace cedar::tokenizer {

// The class of each id in [0, tokenizer.vocab_size()); *n_classes receives the class count.
std::vector<int32_t> build_engram_token_map(const Tokenizer& tokenizer, int* n_classes);

// The normalisation chain alone (exposed for tests).
std::string engram_normalize(std::string text);

// The class count the DeepSeek-V4.1 reference asserts (config engram_compressed_vocab_size).
inline constexpr int kV41EngramClasses = 99092;

}  // namespace cedar::tokenizer
