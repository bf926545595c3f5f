#include "tokenizer/engram_token_map.h"

#include <unordered_map>

#include "tokenizer/pipeline.h"

namespace cedar::tokenizer {
namespace {

constexpr std::string_view kSentinel = "\xEE\x80\x80";  // U+E000, a private-use character

// Replace(Regex("[ \t\r\n]+"), " ").
std::string collapse_spacing(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  bool in_run = false;
  for (char c : s) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      if (!in_run) out.push_back(' ');
      in_run = true;
    } else {
      out.push_back(c);
      in_run = false;
    }
  }
  return out;
}

}  // namespace

std::string engram_normalize(std::string text) {
  // Errors cannot happen on valid UTF-8 (decode_token_raw always returns valid UTF-8).
  (void)unicode_normalize(UnicodeForm::kNFKC, &text);
  (void)unicode_normalize(UnicodeForm::kNFD, &text);
  strip_combining_marks(&text);
  lowercase_per_char(&text);
  text = collapse_spacing(text);
  // Replace(Regex("^ $"), sentinel): no newline is left, so ^ and $ are the ends of the text.
  if (text == " ") text = std::string(kSentinel);
  strip_white_space(&text, true, true);
  if (text == kSentinel) text = " ";
  return text;
}

std::vector<int32_t> build_engram_token_map(const Tokenizer& tokenizer, int* n_classes) {
  const int n = tokenizer.vocab_size();
  std::vector<int32_t> map(static_cast<size_t>(n));
  std::unordered_map<std::string, int32_t> classes;
  classes.reserve(static_cast<size_t>(n));
  for (int id = 0; id < n; ++id) {
    const std::string text = tokenizer.decode_token_raw(id);
    std::string key;
    if (text.find("\xEF\xBF\xBD") != std::string::npos) {
      key = std::string(tokenizer.id_to_token(id).value_or(""));
    } else {
      key = engram_normalize(text);
      if (key.empty()) key = text;
    }
    auto [it, inserted] = classes.emplace(std::move(key), static_cast<int32_t>(classes.size()));
    map[static_cast<size_t>(id)] = it->second;
  }
  if (n_classes) *n_classes = static_cast<int>(classes.size());
  return map;
}

}  // namespace cedar::tokenizer
