// The stages of a Hugging Face tokenizer.json pipeline other than the model: normalisers,
// pre-tokenisers and decoders. Each is built from its JSON object and behaves like the Rust
// `tokenizers` component of the same "type" (only ids and text, no offsets). Internal to the
// tokenizer module; the public API is tokenizer.h.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/regex.h"

namespace cedar::tokenizer {

// ---------------------------------------------------------------------------------------------
// Normalisers

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` (valid UTF-8) in place.
  virtual Status apply(std::string* text) const = 0;
};

// Builds the normaliser described by a tokenizer.json "normalizer" object (null -> nullptr, which
// means "leave the text alone"). Supported types: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip,
// StripAccents, Replace, Prepend. Others are Unimplemented errors that name the type.
Result<std::unique_ptr<Normalizer>> make_normalizer(const nlohmann::json& spec);

// Unicode steps exposed for the Engram token map (same semantics as the tokenizer.json types).
enum class UnicodeForm { kNFC, kNFD, kNFKC, kNFKD };
Status unicode_normalize(UnicodeForm form, std::string* text);
// Lowercases each code point on its own with its full (SpecialCasing) mapping, like Rust's
// char::to_lowercase, which Hugging Face's Lowercase normaliser applies.
void lowercase_per_char(std::string* text);
// Removes combining marks (General_Category M*), Hugging Face's StripAccents.
void strip_combining_marks(std::string* text);
// Removes leading and/or trailing White_Space characters, Hugging Face's Strip.
void strip_white_space(std::string* text, bool left, bool right);

// ---------------------------------------------------------------------------------------------
// Pre-tokenisers

// A piece of the text being split: a byte range of the working buffer.
struct Piece {
  uint32_t begin = 0;
  uint32_t end = 0;
};

// How a Split keeps its matches (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizeStep {
 public:
  virtual ~PreTokenizeStep() = default;
  // Replaces `pieces` (ranges of *buffer) by their split. May append to *buffer (a prefix space).
  virtual Status apply(std::string* buffer, std::vector<Piece>* pieces) const = 0;
};

struct PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizeStep>> steps;
  // True when the last step is ByteLevel: words reach the model as raw bytes that the model reads
  // through the byte->char alphabet (utf8.h byte_to_char).
  bool byte_level = false;
};

// Builds the pre-tokeniser of a tokenizer.json "pre_tokenizer" object (null -> no steps).
// Supported: Sequence, Split, ByteLevel (last only), Digits, Whitespace, WhitespaceSplit,
// Punctuation.
Result<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec);

// The pattern-and-behaviour split used by Split, Digits and friends; exposed for tests.
Status split_pieces(const Regex& regex, SplitBehavior behavior, bool invert, std::string_view buffer,
                    std::vector<Piece>* pieces);

// ---------------------------------------------------------------------------------------------
// Decoders

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Transforms the token strings (Hugging Face's decode_chain).
  virtual void decode_chain(std::vector<std::string>* tokens) const = 0;
  // True when decoding is "concatenate each token's bytes, then lossy UTF-8" (ByteLevel): lets the
  // tokenizer precompute per-token bytes and stream without re-decoding.
  virtual bool is_byte_level() const { return false; }
};

// Builds the decoder of a tokenizer.json "decoder" object (null -> nullptr: tokens are joined with
// spaces). Supported: Sequence, ByteLevel, Replace, Strip, Fuse, ByteFallback.
Result<std::unique_ptr<Decoder>> make_decoder(const nlohmann::json& spec);

// The bytes a ByteLevel decoder produces for one token string: each char mapped back through the
// byte alphabet, or the token's own UTF-8 when any char is outside it.
std::string byte_level_token_bytes(std::string_view token);

}  // namespace cedar::tokenizer
