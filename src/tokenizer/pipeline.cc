#include "tokenizer/pipeline.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>
#include <unicode/ustring.h>

#include <algorithm>
#include <utility>

#include "tokenizer/utf8.h"

namespace cedar::tokenizer {
namespace {

using json = nlohmann::json;

std::string type_of(const json& spec) {
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) return "";
  return spec["type"].get<std::string>();
}

bool bool_field(const json& spec, const char* key, bool fallback) {
  auto it = spec.find(key);
  return it != spec.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

// A tokenizer.json pattern object: {"String": "..."} (a literal) or {"Regex": "..."} (Oniguruma).
Result<Regex> compile_pattern(const json& pattern, const std::string& where) {
  if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
    return Regex::compile(pattern["String"].get<std::string>(), /*literal=*/true);
  }
  if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
    CEDAR_ASSIGN_OR_RETURN(std::string translated, translate_onig_pattern(pattern["Regex"].get<std::string>()));
    return Regex::compile(translated);
  }
  return invalid_argument(where + ": \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
}

Result<SplitBehavior> parse_behavior(const json& spec, const std::string& where) {
  const std::string b = spec.value("behavior", std::string("Isolated"));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return invalid_argument(where + ": unknown split behavior '" + b + "'");
}

// ---------------------------------------------------------------------------------------------
// Normalisers

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  Status apply(std::string* text) const override {
    for (const auto& s : steps_) CEDAR_RETURN_IF_ERROR(s->apply(text));
    return {};
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(UnicodeForm form) : form_(form) {}
  Status apply(std::string* text) const override { return unicode_normalize(form_, text); }

 private:
  UnicodeForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  Status apply(std::string* text) const override {
    lowercase_per_char(text);
    return {};
  }
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  Status apply(std::string* text) const override {
    strip_combining_marks(text);
    return {};
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status apply(std::string* text) const override {
    strip_white_space(text, left_, right_);
    return {};
  }

 private:
  bool left_, right_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  Status apply(std::string* text) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    CEDAR_RETURN_IF_ERROR(pattern_.find_all(*text, &matches));
    if (matches.empty()) return {};
    std::string out;
    out.reserve(text->size());
    size_t prev = 0;
    for (const auto& [b, e] : matches) {
      out.append(*text, prev, b - prev);
      out.append(content_);
      prev = e;
    }
    out.append(*text, prev, std::string::npos);
    *text = std::move(out);
    return {};
  }

 private:
  Regex pattern_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  Status apply(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
    return {};
  }

 private:
  std::string prefix_;
};

// ---------------------------------------------------------------------------------------------
// Pre-tokenisers

class SplitStep final : public PreTokenizeStep {
 public:
  SplitStep(Regex regex, SplitBehavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  Status apply(std::string* buffer, std::vector<Piece>* pieces) const override {
    return split_pieces(regex_, behavior_, invert_, *buffer, pieces);
  }

 private:
  Regex regex_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelStep final : public PreTokenizeStep {
 public:
  ByteLevelStep(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  Status apply(std::string* buffer, std::vector<Piece>* pieces) const override {
    if (add_prefix_space_) {
      // Hugging Face prepends the space to every piece that does not start with one.
      for (Piece& p : *pieces) {
        if (p.end > p.begin && (*buffer)[p.begin] == ' ') continue;
        const auto begin = static_cast<uint32_t>(buffer->size());
        buffer->push_back(' ');
        buffer->append(*buffer, p.begin, p.end - p.begin);
        p = {begin, static_cast<uint32_t>(buffer->size())};
      }
    }
    if (regex_) return split_pieces(*regex_, SplitBehavior::kIsolated, false, *buffer, pieces);
    return {};
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

Status add_regex_step(PreTokenizer* pt, std::string_view onig_pattern, SplitBehavior behavior, bool invert) {
  CEDAR_ASSIGN_OR_RETURN(std::string translated, translate_onig_pattern(onig_pattern));
  CEDAR_ASSIGN_OR_RETURN(Regex regex, Regex::compile(translated));
  pt->steps.push_back(std::make_unique<SplitStep>(std::move(regex), behavior, invert));
  return {};
}

Status build_pre_tokenizer(const json& spec, PreTokenizer* pt) {
  const std::string type = type_of(spec);
  const std::string where = "tokenizer.json pre_tokenizer " + type;
  if (pt->byte_level) {
    return unimplemented("tokenizer.json: a pre-tokenizer (" + type +
                         ") follows ByteLevel; cedar supports ByteLevel only as the last step");
  }
  if (type == "Sequence") {
    if (!spec.contains("pretokenizers") || !spec["pretokenizers"].is_array()) {
      return invalid_argument(where + ": missing \"pretokenizers\" array");
    }
    for (const auto& s : spec["pretokenizers"]) CEDAR_RETURN_IF_ERROR(build_pre_tokenizer(s, pt));
    return {};
  }
  if (type == "Split") {
    if (!spec.contains("pattern")) return invalid_argument(where + ": missing \"pattern\"");
    CEDAR_ASSIGN_OR_RETURN(Regex regex, compile_pattern(spec["pattern"], where));
    CEDAR_ASSIGN_OR_RETURN(SplitBehavior behavior, parse_behavior(spec, where));
    pt->steps.push_back(std::make_unique<SplitStep>(std::move(regex), behavior, bool_field(spec, "invert", false)));
    return {};
  }
  if (type == "ByteLevel") {
    std::unique_ptr<Regex> regex;
    if (bool_field(spec, "use_regex", true)) {
      // GPT-2's split pattern, which Hugging Face's ByteLevel uses when use_regex is set.
      CEDAR_ASSIGN_OR_RETURN(std::string translated,
                             translate_onig_pattern("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
                                                    "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"));
      CEDAR_ASSIGN_OR_RETURN(Regex r, Regex::compile(translated));
      regex = std::make_unique<Regex>(std::move(r));
    }
    pt->steps.push_back(std::make_unique<ByteLevelStep>(bool_field(spec, "add_prefix_space", true), std::move(regex)));
    pt->byte_level = true;
    return {};
  }
  if (type == "Digits") {
    // char::is_numeric is Nd|Nl|No = \p{N}; runs are kept together unless individual_digits.
    return bool_field(spec, "individual_digits", false)
               ? add_regex_step(pt, "\\p{N}", SplitBehavior::kIsolated, false)
               : add_regex_step(pt, "\\p{N}+", SplitBehavior::kIsolated, false);
  }
  if (type == "Whitespace") return add_regex_step(pt, "\\w+|[^\\w\\s]+", SplitBehavior::kRemoved, true);
  if (type == "WhitespaceSplit") return add_regex_step(pt, "\\s+", SplitBehavior::kRemoved, false);
  if (type == "Punctuation") {
    CEDAR_ASSIGN_OR_RETURN(SplitBehavior behavior, parse_behavior(spec, where));
    return add_regex_step(pt, "[\\p{P}!-/:-@\\[-`{-~]", behavior, false);
  }
  return unimplemented("tokenizer.json: pre_tokenizer type '" + type +
                       "' is not supported by cedar (supported: Sequence, Split, ByteLevel, Digits, "
                       "Whitespace, WhitespaceSplit, Punctuation)");
}

// ---------------------------------------------------------------------------------------------
// Decoders

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>* tokens) const override {
    for (const auto& s : steps_) s->decode_chain(tokens);
  }
  bool is_byte_level() const override { return steps_.size() == 1 && steps_[0]->is_byte_level(); }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const auto& t : *tokens) bytes += byte_level_token_bytes(t);
    tokens->assign(1, utf8_lossy(bytes));
  }
  bool is_byte_level() const override { return true; }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) {
      std::vector<std::pair<size_t, size_t>> matches;
      if (!pattern_.find_all(t, &matches).ok() || matches.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (const auto& [b, e] : matches) {
        out.append(t, prev, b - prev);
        out.append(content_);
        prev = e;
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  Regex pattern_;
  std::string content_;
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const auto& t : *tokens) all += t;
    tokens->assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) {
      std::vector<char32_t> cps;
      for (size_t i = 0; i < t.size();) cps.push_back(next_code_point(t, &i));
      size_t b = 0, e = cps.size();
      for (size_t k = 0; k < start_ && b < e && cps[b] == content_; ++k) ++b;
      for (size_t k = 0; k < stop_ && e > b && cps[e - 1] == content_; ++k) --e;
      std::string out;
      for (size_t i = b; i < e; ++i) append_utf8(cps[i], &out);
      t = std::move(out);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (is_valid_utf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (auto& t : *tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        char* endp = nullptr;
        const std::string hex = t.substr(3, 2);
        const long v = std::strtol(hex.c_str(), &endp, 16);
        if (endp == hex.c_str() + 2) byte = static_cast<int>(v);
      }
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    *tokens = std::move(out);
  }
};

Result<std::unique_ptr<Decoder>> build_decoder(const json& spec) {
  const std::string type = type_of(spec);
  const std::string where = "tokenizer.json decoder " + type;
  if (type == "Sequence") {
    if (!spec.contains("decoders") || !spec["decoders"].is_array()) {
      return invalid_argument(where + ": missing \"decoders\" array");
    }
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& s : spec["decoders"]) {
      CEDAR_ASSIGN_OR_RETURN(auto d, build_decoder(s));
      steps.push_back(std::move(d));
    }
    return std::unique_ptr<Decoder>(std::make_unique<SequenceDecoder>(std::move(steps)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(std::make_unique<ByteLevelDecoder>());
  if (type == "Fuse") return std::unique_ptr<Decoder>(std::make_unique<FuseDecoder>());
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(std::make_unique<ByteFallbackDecoder>());
  if (type == "Replace") {
    if (!spec.contains("pattern") || !spec.contains("content") || !spec["content"].is_string()) {
      return invalid_argument(where + ": needs \"pattern\" and \"content\"");
    }
    CEDAR_ASSIGN_OR_RETURN(Regex regex, compile_pattern(spec["pattern"], where));
    return std::unique_ptr<Decoder>(
        std::make_unique<ReplaceDecoder>(std::move(regex), spec["content"].get<std::string>()));
  }
  if (type == "Strip") {
    const std::string content = spec.value("content", std::string(" "));
    if (content.empty() || !is_valid_utf8(content)) return invalid_argument(where + ": bad \"content\"");
    size_t pos = 0;
    const char32_t cp = next_code_point(content, &pos);
    return std::unique_ptr<Decoder>(std::make_unique<StripDecoder>(cp, spec.value("start", size_t{0}),
                                                                   spec.value("stop", size_t{0})));
  }
  return unimplemented("tokenizer.json: decoder type '" + type +
                       "' is not supported by cedar (supported: Sequence, ByteLevel, Replace, Strip, Fuse, "
                       "ByteFallback)");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Unicode steps

Status unicode_normalize(UnicodeForm form, std::string* text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case UnicodeForm::kNFC: n = icu::Normalizer2::getNFCInstance(status); break;
    case UnicodeForm::kNFD: n = icu::Normalizer2::getNFDInstance(status); break;
    case UnicodeForm::kNFKC: n = icu::Normalizer2::getNFKCInstance(status); break;
    case UnicodeForm::kNFKD: n = icu::Normalizer2::getNFKDInstance(status); break;
  }
  if (U_FAILURE(status)) return internal_error(std::string("ICU normaliser unavailable: ") + u_errorName(status));
  // Quick check first: most text is already normalised and needs no copy.
  if (n->isNormalizedUTF8(icu::StringPiece(text->data(), static_cast<int32_t>(text->size())), status) &&
      U_SUCCESS(status)) {
    return {};
  }
  status = U_ZERO_ERROR;
  std::string out;
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text->size()));
  n->normalizeUTF8(0, icu::StringPiece(text->data(), static_cast<int32_t>(text->size())), sink, nullptr, status);
  if (U_FAILURE(status)) return invalid_argument(std::string("Unicode normalisation failed: ") + u_errorName(status));
  *text = std::move(out);
  return {};
}

void lowercase_per_char(std::string* text) {
  std::string out;
  out.reserve(text->size());
  for (size_t i = 0; i < text->size();) {
    const auto b = static_cast<unsigned char>((*text)[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b));
      ++i;
      continue;
    }
    const char32_t cp = next_code_point(*text, &i);
    UChar src[2];
    int32_t src_len = 0;
    U16_APPEND_UNSAFE(src, src_len, cp);
    UChar dst[8];
    UErrorCode status = U_ZERO_ERROR;
    // A lone code point gives the context-free full mapping (Final_Sigma never applies).
    const int32_t n = u_strToLower(dst, 8, src, src_len, "", &status);
    if (U_FAILURE(status) || n > 8) {
      append_utf8(cp, &out);
      continue;
    }
    for (int32_t k = 0; k < n;) {
      UChar32 c;
      U16_NEXT_UNSAFE(dst, k, c);
      append_utf8(static_cast<char32_t>(c), &out);
    }
  }
  *text = std::move(out);
}

void strip_combining_marks(std::string* text) {
  std::string out;
  out.reserve(text->size());
  for (size_t i = 0; i < text->size();) {
    const size_t start = i;
    const char32_t cp = next_code_point(*text, &i);
    const int8_t t = u_charType(static_cast<UChar32>(cp));
    if (t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK || t == U_COMBINING_SPACING_MARK) continue;
    out.append(*text, start, i - start);
  }
  *text = std::move(out);
}

void strip_white_space(std::string* text, bool left, bool right) {
  size_t b = 0, e = text->size();
  if (left) {
    while (b < e) {
      size_t next = b;
      if (!unicode_white_space(next_code_point(*text, &next))) break;
      b = next;
    }
  }
  if (right) {
    while (e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) --start;
      size_t next = start;
      if (!unicode_white_space(next_code_point(*text, &next))) break;
      e = start;
    }
  }
  *text = text->substr(b, e - b);
}

Result<std::unique_ptr<Normalizer>> make_normalizer(const json& spec) {
  if (spec.is_null()) return std::unique_ptr<Normalizer>();
  const std::string type = type_of(spec);
  const std::string where = "tokenizer.json normalizer " + type;
  if (type == "Sequence") {
    if (!spec.contains("normalizers") || !spec["normalizers"].is_array()) {
      return invalid_argument(where + ": missing \"normalizers\" array");
    }
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& s : spec["normalizers"]) {
      CEDAR_ASSIGN_OR_RETURN(auto n, make_normalizer(s));
      if (n) steps.push_back(std::move(n));
    }
    if (steps.empty()) return std::unique_ptr<Normalizer>();  // an empty sequence changes nothing
    return std::unique_ptr<Normalizer>(std::make_unique<SequenceNormalizer>(std::move(steps)));
  }
  if (type == "NFC") return std::unique_ptr<Normalizer>(std::make_unique<UnicodeNormalizer>(UnicodeForm::kNFC));
  if (type == "NFD") return std::unique_ptr<Normalizer>(std::make_unique<UnicodeNormalizer>(UnicodeForm::kNFD));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(std::make_unique<UnicodeNormalizer>(UnicodeForm::kNFKC));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(std::make_unique<UnicodeNormalizer>(UnicodeForm::kNFKD));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(std::make_unique<LowercaseNormalizer>());
  if (type == "StripAccents") return std::unique_ptr<Normalizer>(std::make_unique<StripAccentsNormalizer>());
  if (type == "Strip") {
    return std::unique_ptr<Normalizer>(std::make_unique<StripNormalizer>(bool_field(spec, "strip_left", true),
                                                                         bool_field(spec, "strip_right", true)));
  }
  if (type == "Replace") {
    if (!spec.contains("pattern") || !spec.contains("content") || !spec["content"].is_string()) {
      return invalid_argument(where + ": needs \"pattern\" and \"content\"");
    }
    CEDAR_ASSIGN_OR_RETURN(Regex regex, compile_pattern(spec["pattern"], where));
    return std::unique_ptr<Normalizer>(
        std::make_unique<ReplaceNormalizer>(std::move(regex), spec["content"].get<std::string>()));
  }
  if (type == "Prepend") {
    if (!spec.contains("prepend") || !spec["prepend"].is_string()) return invalid_argument(where + ": needs \"prepend\"");
    return std::unique_ptr<Normalizer>(std::make_unique<PrependNormalizer>(spec["prepend"].get<std::string>()));
  }
  return unimplemented("tokenizer.json: normalizer type '" + type +
                       "' is not supported by cedar (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, "
                       "Strip, StripAccents, Replace, Prepend)");
}

Result<PreTokenizer> make_pre_tokenizer(const json& spec) {
  PreTokenizer pt;
  if (spec.is_null()) return pt;
  CEDAR_RETURN_IF_ERROR(build_pre_tokenizer(spec, &pt));
  return pt;
}

Status split_pieces(const Regex& regex, SplitBehavior behavior, bool invert, std::string_view buffer,
                    std::vector<Piece>* pieces) {
  struct Span {
    uint32_t b, e;
    bool match;
  };
  std::vector<Piece> out;
  out.reserve(pieces->size() * 2);
  std::vector<std::pair<size_t, size_t>> found;
  std::vector<Span> spans;
  for (const Piece& piece : *pieces) {
    const std::string_view sub = buffer.substr(piece.begin, piece.end - piece.begin);
    found.clear();
    CEDAR_RETURN_IF_ERROR(regex.find_all(sub, &found));
    // Matches and the gaps between them, as Hugging Face's find_matches lists them.
    spans.clear();
    size_t prev = 0;
    for (const auto& [b, e] : found) {
      if (prev != b) spans.push_back({static_cast<uint32_t>(prev), static_cast<uint32_t>(b), false});
      spans.push_back({static_cast<uint32_t>(b), static_cast<uint32_t>(e), true});
      prev = e;
    }
    if (prev != sub.size()) spans.push_back({static_cast<uint32_t>(prev), static_cast<uint32_t>(sub.size()), false});
    if (invert) {
      for (auto& s : spans) s.match = !s.match;
    }
    // Combine according to the behaviour; `keep` marks spans that survive.
    std::vector<std::pair<Span, bool>> kept;  // (span, removed)
    switch (behavior) {
      case SplitBehavior::kIsolated:
        for (const auto& s : spans) kept.push_back({s, false});
        break;
      case SplitBehavior::kRemoved:
        for (const auto& s : spans) kept.push_back({s, s.match});
        break;
      case SplitBehavior::kMergedWithPrevious: {
        bool previous_match = false;
        for (const auto& s : spans) {
          if (s.match && !previous_match && !kept.empty()) {
            kept.back().first.e = s.e;
          } else {
            kept.push_back({s, false});
          }
          previous_match = s.match;
        }
        break;
      }
      case SplitBehavior::kMergedWithNext: {
        bool previous_match = false;
        for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
          if (it->match && !previous_match && !kept.empty()) {
            kept.back().first.b = it->b;
          } else {
            kept.push_back({*it, false});
          }
          previous_match = it->match;
        }
        std::reverse(kept.begin(), kept.end());
        break;
      }
      case SplitBehavior::kContiguous: {
        bool previous_match = false;
        for (const auto& s : spans) {
          if (s.match == previous_match && !kept.empty()) {
            kept.back().first.e = s.e;
          } else {
            kept.push_back({s, false});
          }
          previous_match = s.match;
        }
        break;
      }
    }
    for (const auto& [s, removed] : kept) {
      if (removed || s.e == s.b) continue;
      out.push_back({piece.begin + s.b, piece.begin + s.e});
    }
  }
  *pieces = std::move(out);
  return {};
}

Result<std::unique_ptr<Decoder>> make_decoder(const json& spec) {
  if (spec.is_null()) return std::unique_ptr<Decoder>();
  return build_decoder(spec);
}

std::string byte_level_token_bytes(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const int b = char_to_byte(next_code_point(token, &i));
    if (b < 0) return std::string(token);  // not a byte-level token: its UTF-8 as is
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

}  // namespace cedar::tokenizer
