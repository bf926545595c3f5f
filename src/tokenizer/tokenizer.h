// cedar's tokenizer: reads any Hugging Face `tokenizer.json` whose model is BPE (byte-level or
// not) and encodes exactly like Hugging Face's Rust `tokenizers` library:
//
//   text -> added/special tokens split out (leftmost-longest, before normalisation for tokens
//   with "normalized": false, after it for the others) -> normaliser -> pre-tokeniser (Split
//   regexes run by PCRE2 with UTF+UCP) -> BPE merges by rank per word -> ids.
//
// `tokenizer_config.json` (optional) decides whether encode(..., add_special=true) adds BOS/EOS
// (`add_bos_token` / `add_eos_token`) and whether decode cleans up spaces
// (`clean_up_tokenization_spaces`). Without it, the tokenizer.json post-processor decides.
//
// A Tokenizer is immutable after load and safe to use from many threads at once (each thread
// keeps its own word cache).
//
//   auto tok = Tokenizer::load("tokenizer.json", "tokenizer_config.json");
//   if (!tok.ok()) ... tok.status().to_string() ...
//   auto ids = (*tok)->encode("Hello", /*add_special=*/true);   // Result<std::vector<TokenId>>
//   auto text = (*tok)->decode(*ids, /*skip_special=*/false);   // Result<std::string>
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace cedar::tokenizer {

using TokenId = int32_t;

// An entry of tokenizer.json's "added_tokens".
struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;     // skipped by decode(..., skip_special=true)
  bool normalized = false;  // matched in the normalised text (true) or the raw text (false)
  bool lstrip = false;      // swallows white space on its left
  bool rstrip = false;      // swallows white space on its right
  bool single_word = false; // matches only when not inside a word
};

class Tokenizer {
 public:
  // Loads tokenizer.json and, when `config_path` is not empty, tokenizer_config.json.
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& tokenizer_json_path,
                                                 const std::string& config_path = "");
  // Loads `dir`/tokenizer.json and `dir`/tokenizer_config.json (the latter only if it exists).
  static Result<std::unique_ptr<Tokenizer>> load_dir(const std::string& dir);
  // Builds from the JSON texts themselves (`config_json` may be empty). `source` names the input
  // in error messages.
  static Result<std::unique_ptr<Tokenizer>> from_json(std::string_view tokenizer_json, std::string_view config_json,
                                                      const std::string& source = "tokenizer.json");
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Encodes UTF-8 text. Special tokens written in the text are recognised (as in Hugging Face).
  // `add_special` adds BOS/EOS as the configuration says. Invalid UTF-8 is an InvalidArgument error
  // giving the byte offset.
  Result<std::vector<TokenId>> encode(std::string_view text, bool add_special = false) const;
  // Appends the ids of `text` (no BOS/EOS) to *out. Same errors as encode().
  Status encode_append(std::string_view text, std::vector<TokenId>* out) const;
  // Appends the ids of `text` read as plain text: added tokens (special or not) are not recognised,
  // so text that spells a control marker is encoded as ordinary characters. Prompt encoding uses
  // this for everything a client wrote (DeepSeek's encoders do the same between their special
  // ranges). Same errors as encode().
  Status encode_plain_append(std::string_view text, std::vector<TokenId>* out) const;

  // Decodes ids to text like Hugging Face's Tokenizer.decode (bytes that do not form UTF-8 become
  // U+FFFD). An id outside [0, vocab_size()) or unassigned is an InvalidArgument error.
  Result<std::string> decode(std::span<const TokenId> ids, bool skip_special = false) const;
  // The text of one token as the raw Rust tokenizer decodes it alone (decode([id]) with special
  // tokens kept, no clean-up); "" for an unassigned id. The Engram token map keys on this.
  std::string decode_token_raw(TokenId id) const;
  // The bytes one token contributes to a decoded text (before UTF-8 repair); empty when the
  // decoder is not byte-level. Streaming decoders concatenate these.
  std::string_view token_bytes(TokenId id) const;
  bool has_byte_level_decoder() const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  // The vocabulary string of an id (byte-level alphabet form, e.g. "Ġthe"), or nullopt.
  std::optional<std::string_view> id_to_token(TokenId id) const;
  // One past the highest assigned id (Hugging Face's len(tokenizer)).
  int vocab_size() const;
  bool is_special(TokenId id) const;
  const std::vector<AddedToken>& added_tokens() const;

  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  bool adds_bos() const;  // what encode(..., add_special=true) does
  bool adds_eos() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  static Result<std::unique_ptr<Tokenizer>> from_json_checked(std::string_view tokenizer_json,
                                                              std::string_view config_json, const std::string& source);
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of ids into text deltas that are always whole UTF-8 characters, so a server can
// forward each delta at once. Concatenating every delta (plus finish()) equals decode(all ids).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  // Returns the text that `id` completes (possibly empty while a character is still partial).
  Result<std::string> push(TokenId id);
  // Flushes what is still held back (an incomplete character becomes U+FFFD).
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_bytes_;      // byte-level decoders: bytes of an unfinished character
  std::vector<TokenId> ids_;       // other decoders: every id so far
  std::string emitted_;            // other decoders: text already returned
};

}  // namespace cedar::tokenizer
