#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "tokenizer/utf8.h"

namespace cedar::tokenizer {
namespace {

// Unicode White_Space (what Oniguruma's `\s` matches with a Unicode encoding).
constexpr std::string_view kSpaceItems =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
constexpr std::string_view kHexItems = "0-9a-fA-F";

// Per general category: the code points Hugging Face's Oniguruma (Unicode 16) has in it beyond
// PCRE2 10.42's Unicode 14 tables; "w" is Oniguruma's whole \w. Generated from the oracle.
struct ClassExtra {
  std::string_view name;
  std::string_view items;
};
constexpr ClassExtra kClassExtras[] = {
#include "tokenizer/unicode_classes.inc"
};

std::string_view class_extra(std::string_view name) {
  for (const auto& e : kClassExtras) {
    if (e.name == name) return e.items;
  }
  return {};
}

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match state: PCRE2 match data and JIT stacks must not be shared between threads.
struct ThreadMatchState {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ThreadMatchState() {
    match_data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    // Long runs of whitespace or letters backtrack over the whole run; give JIT room for them.
    jit_stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match_data);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

Result<std::string> translate_onig_pattern(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in `p` just after the '[' (or '[^') that opened the class
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) return invalid_argument("regex ends with a lone backslash: " + std::string(p));
      const char e = p[i + 1];
      ++i;
      std::string items;  // the class items the escape stands for ("" = same in both engines)
      bool negated = false;
      switch (e) {
        case 's': items = kSpaceItems; break;
        case 'S': items = kSpaceItems; negated = true; break;
        case 'w': items = class_extra("w"); break;
        case 'W': items = class_extra("w"); negated = true; break;
        case 'd': items = "\\p{Nd}" + std::string(class_extra("Nd")); break;
        case 'D': items = "\\p{Nd}" + std::string(class_extra("Nd")); negated = true; break;
        case 'h': items = kHexItems; break;
        case 'H': items = kHexItems; negated = true; break;
        case 'p':
        case 'P': {
          // \pL or \p{Name}: general categories get the code points newer Unicode added.
          std::string name;
          size_t consumed = 0;
          if (i + 1 < p.size() && p[i + 1] == '{') {
            const size_t close = p.find('}', i + 2);
            if (close == std::string_view::npos) return invalid_argument("regex has an unterminated \\p{: " + std::string(p));
            name = std::string(p.substr(i + 2, close - i - 2));
            consumed = close - i;
          } else if (i + 1 < p.size()) {
            name = std::string(1, p[i + 1]);
            consumed = 1;
          }
          const std::string_view extra = class_extra(name);
          if (name.empty() || name == "w" || (extra.empty() && name != "Z" && name != "Pc")) break;
          items = "\\p{" + name + "}" + std::string(extra);
          negated = e == 'P';
          i += consumed;
          break;
        }
        default: break;
      }
      if (items.empty()) {  // an escape with the same meaning in both engines
        out.push_back('\\');
        out.push_back(e);
        continue;
      }
      if (in_class) {
        if (negated) {
          return unimplemented("regex uses a negated class escape \\" + std::string(1, e) +
                               " inside [...], which cedar cannot translate from Oniguruma: " +
                               std::string(p));
        }
        out.append(items);
      } else {
        out.append(negated ? "[^" : "[");
        out.append(items);
        out.push_back(']');
      }
      continue;
    }
    if (in_class) {
      if (c == '[') {
        // POSIX bracket expressions like [:alpha:] exist in both engines; nested classes and
        // Oniguruma's && intersection do not exist in PCRE2.
        if (i + 1 < p.size() && p[i + 1] == ':') {
          const size_t close = p.find(":]", i + 2);
          if (close == std::string_view::npos) return invalid_argument("unterminated [: in regex");
          out.append(p.substr(i, close + 2 - i));
          i = close + 1;
          continue;
        }
        return unimplemented("regex uses a nested character class (Oniguruma only): " + std::string(p));
      }
      if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
        return unimplemented("regex uses class intersection && (Oniguruma only): " + std::string(p));
      }
      // A ']' right after '[' or '[^' is a literal in both engines.
      if (c == ']' && i != class_start) in_class = false;
      out.push_back(c);
      continue;
    }
    if (c == '[') {
      in_class = true;
      out.push_back('[');
      if (i + 1 < p.size() && p[i + 1] == '^') {
        out.push_back('^');
        ++i;
      }
      class_start = i + 1;
      continue;
    }
    out.push_back(c);
  }
  if (in_class) return invalid_argument("regex has an unterminated character class: " + std::string(p));
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(std::unique_ptr<Impl> impl, std::string pattern)
    : impl_(std::move(impl)), pattern_(std::move(pattern)) {}
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

Result<Regex> Regex::compile(std::string_view pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // MULTILINE: in Oniguruma's Ruby syntax ^ and $ are line anchors.
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
  if (literal) options = PCRE2_UTF | PCRE2_LITERAL;
  auto impl = std::make_unique<Impl>();
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err,
                             &err_offset, nullptr);
  if (!impl->code) {
    return invalid_argument("cannot compile regex '" + std::string(pattern) + "' at offset " +
                            std::to_string(err_offset) + ": " + pcre2_error_text(err));
  }
  impl->jit = pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE) == 0;
  return Regex(std::move(impl), std::string(pattern));
}

Status Regex::find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>* out) const {
  ThreadMatchState& st = thread_match_state();
  const auto* data = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t pos = 0;
  while (pos <= subject.size()) {
    const int rc = impl_->jit ? pcre2_jit_match(impl_->code, data, subject.size(), pos, 0, st.match_data,
                                                st.context)
                              : pcre2_match(impl_->code, data, subject.size(), pos, PCRE2_NO_UTF_CHECK,
                                            st.match_data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return resource_exhausted("regex '" + pattern_ + "' failed on a " + std::to_string(subject.size()) +
                                "-byte piece: " + pcre2_error_text(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.match_data);
    const size_t start = ov[0], end = ov[1];
    out->emplace_back(start, end);
    if (end > start) {
      pos = end;
    } else {
      if (end >= subject.size()) break;
      size_t next = end;
      next_code_point(subject, &next);
      pos = next;
    }
  }
  return {};
}

}  // namespace cedar::tokenizer
