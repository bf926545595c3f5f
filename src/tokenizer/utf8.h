// UTF-8 helpers shared by the tokenizer, the chat encoder and the completion parser: validation,
// code point iteration, the GPT-2 byte<->char table of byte-level BPE, and the "lossy" UTF-8
// decoding that Hugging Face's decoders apply (Rust's String::from_utf8_lossy).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cedar::tokenizer {

// Byte length of the longest prefix of `s` that is valid UTF-8 (Unicode scalar values only:
// no surrogates, no overlongs, nothing above U+10FFFF). Equals s.size() when all of s is valid.
size_t valid_utf8_prefix(std::string_view s);
inline bool is_valid_utf8(std::string_view s) { return valid_utf8_prefix(s) == s.size(); }

// Decodes the code point starting at s[*pos] and advances *pos past it. `s` must be valid UTF-8.
char32_t next_code_point(std::string_view s, size_t* pos);

// Appends the UTF-8 encoding of `cp` (a Unicode scalar value).
void append_utf8(char32_t cp, std::string* out);

// Converts bytes to text the way Rust's String::from_utf8_lossy does: every maximal ill-formed
// subsequence (in the Unicode "maximal subpart" sense) becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Number of bytes at the end of `bytes` that form an incomplete but so-far valid UTF-8 sequence
// (0..3). A streaming decoder holds these back until the next token completes them.
size_t incomplete_utf8_tail(std::string_view bytes);

// The byte-level BPE alphabet (GPT-2's bytes_to_unicode): byte b is shown as code point
// byte_to_char()[b]; printable bytes map to themselves, the rest to U+0100 + n.
const std::array<char32_t, 256>& byte_to_char();
// Inverse of byte_to_char: code point -> byte, or -1 when the code point is not in the alphabet.
int char_to_byte(char32_t cp);

// Python's str.isspace() (used by the official encoder's `\s` in its regexes).
bool python_isspace(char32_t cp);
// Rust's char::is_whitespace (the Unicode White_Space property), used by Hugging Face's Strip
// normaliser and by added-token lstrip/rstrip.
bool unicode_white_space(char32_t cp);

}  // namespace cedar::tokenizer
