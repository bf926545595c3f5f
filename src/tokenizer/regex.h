// PCRE2 (UTF + UCP, JIT) wrapper for the regexes found in tokenizer.json files. Those are written
// for Oniguruma (what Hugging Face's Rust tokenizer runs); translate_onig_pattern() rewrites the
// few escapes whose meaning differs between the two engines so that both match the same text.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace cedar::tokenizer {

// Rewrites an Oniguruma (Ruby syntax, UTF-8) pattern into PCRE2 syntax with the same matches:
// `\s`/`\S` become the Unicode White_Space set (PCRE2's UCP `\s` also takes U+180E, Oniguruma's
// does not), `\w`/`\W`/`\d`/`\D`/`\h` follow Oniguruma's Unicode definitions. Errors name the
// construct that has no faithful translation.
Result<std::string> translate_onig_pattern(std::string_view onig_pattern);

class Regex {
 public:
  // Compiles a PCRE2 pattern with UTF and UCP. `literal` compiles the text as a fixed string.
  static Result<Regex> compile(std::string_view pattern, bool literal = false);
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Appends the [start, end) byte ranges of successive non-overlapping matches in `subject` (which
  // must be valid UTF-8). After an empty match the search resumes one character later, as
  // Oniguruma's find_iter does. The subject is matched on its own: lookarounds do not see text
  // outside it.
  Status find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>* out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  explicit Regex(std::unique_ptr<Impl> impl, std::string pattern);
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace cedar::tokenizer
