#include "constrain/constraint_limits.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "constrain/json_schema_check.h"

namespace cedar::constrain {
namespace {

using json = nlohmann::json;

constexpr int64_t kSaturated = std::numeric_limits<int64_t>::max() / 4;

int64_t saturating_mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > kSaturated / b ? kSaturated : a * b;
}

// A digit run read as a number that stops growing at kSaturated (the text is kept for the message).
int64_t read_count(std::string_view digits) {
  int64_t n = 0;
  for (char c : digits) n = std::min(kSaturated, n * 10 + (c - '0'));
  return n;
}

std::string limit_error(std::string_view what, std::string_view value, int64_t limit, std::string_view where) {
  return std::string(what) + " " + std::string(value) + " exceeds the limit of " + std::to_string(limit) + " (" +
         std::string(where) + ")";
}

// One group of the regex being scanned: its size with every repetition unrolled, and the largest
// product of nested repetition bounds inside it.
struct Group {
  int64_t size = 0;        // atoms, repetitions unrolled
  int64_t last_size = 0;   // the last item's (what a quantifier applies to)
  int64_t chain = 1;       // the largest product of nested bounds in the group
  int64_t last_chain = 1;  // ... of the last item
  bool has_item = false;
};

}  // namespace

// The scan follows the syntax xgrammar's regex converter (regex_converter.cc) reads: literals,
// escapes (`\d`, `\x41`, `\u{1F600}`, ...), classes `[...]` (escapes inside; `]` ends them), groups
// `(`, `(?:`, `(?<name>`, alternation and the quantifiers `*`, `+`, `?`, `{n}`, `{n,}`, `{n,m}`
// (each with an optional lazy `?`). A `{` that does not open a valid count is a literal here;
// xgrammar reports it. Syntax errors are left to xgrammar: this pass only bounds the cost.
Status check_regex(std::string_view re, std::string_view where, const ConstraintLimits& limits) {
  if (re.size() > limits.max_regex_bytes)
    return invalid_argument(limit_error("regex length", std::to_string(re.size()) + " bytes", limits.max_regex_bytes, where));
  std::vector<Group> stack(1);
  auto add_item = [&](int64_t size, int64_t chain) {
    Group& g = stack.back();
    g.size = std::min(kSaturated, g.size + size);
    g.last_size = size;
    g.chain = std::max(g.chain, chain);
    g.last_chain = chain;
    g.has_item = true;
  };
  // A quantifier with bounds [lower, upper] (upper -1: none) on the last item.
  auto quantify = [&](int64_t lower, int64_t upper) -> Status {
    Group& g = stack.back();
    if (!g.has_item) return Status::ok_status();
    // xgrammar unrolls max(lower, upper) copies ({n,} is n copies and a loop).
    const int64_t copies = std::max<int64_t>(1, std::max(lower, upper));
    const int64_t chain = saturating_mul(g.last_chain, copies);
    if (chain > limits.max_repetition_product)
      return invalid_argument(limit_error("regex nested repetition product", std::to_string(chain),
                                          limits.max_repetition_product, where));
    const int64_t size = saturating_mul(g.last_size, copies);
    g.size = std::min(kSaturated, g.size - g.last_size + size);
    g.last_size = size;
    g.chain = std::max(g.chain, chain);
    g.last_chain = chain;
    return Status::ok_status();
  };
  size_t i = 0;
  const size_t n = re.size();
  while (i < n) {
    const char c = re[i];
    if (c == '\\') {
      // An escape is one atom; \u{...}, \p{...} and \P{...} carry braces that are not a count.
      size_t end = std::min(n, i + 2);
      if (i + 2 < n && (re[i + 1] == 'u' || re[i + 1] == 'p' || re[i + 1] == 'P') && re[i + 2] == '{') {
        const size_t close = re.find('}', i + 3);
        end = close == std::string_view::npos ? n : close + 1;
      }
      i = end;
      add_item(1, 1);
    } else if (c == '[') {
      size_t j = i + 1;
      if (j < n && re[j] == '^') ++j;
      if (j < n && re[j] == ']') ++j;  // a leading `]` (xgrammar refuses the empty class; it stays one atom here)
      while (j < n && re[j] != ']') j += re[j] == '\\' ? 2 : 1;
      i = std::min(n, j + 1);
      add_item(1, 1);
    } else if (c == '(') {
      if (static_cast<int>(stack.size()) > limits.max_group_depth)
        return invalid_argument(limit_error("regex group nesting depth", std::to_string(stack.size()),
                                            limits.max_group_depth, where));
      ++i;
      if (i < n && re[i] == '?') {
        ++i;
        if (i < n && re[i] == '<' && i + 1 < n && re[i + 1] != '=' && re[i + 1] != '!') {
          const size_t close = re.find('>', i);
          i = close == std::string_view::npos ? n : close + 1;
        } else if (i < n) {
          ++i;  // ':' (or a modifier xgrammar refuses)
        }
      }
      stack.emplace_back();
    } else if (c == ')') {
      ++i;
      if (stack.size() == 1) continue;  // unmatched: xgrammar reports it
      const Group inner = stack.back();
      stack.pop_back();
      add_item(std::max<int64_t>(inner.size, 1), inner.chain);
    } else if (c == '*' || c == '+' || c == '?') {
      ++i;
      if (i < n && re[i] == '?') ++i;
      CEDAR_RETURN_IF_ERROR(quantify(c == '+' ? 1 : 0, c == '?' ? 1 : -1));
    } else if (c == '{') {
      // {n}, {n,}, {n,m}: anything else is left to xgrammar (a literal here).
      size_t j = i + 1;
      const size_t lo_begin = j;
      while (j < n && std::isdigit(static_cast<unsigned char>(re[j]))) ++j;
      const std::string_view lo_digits = re.substr(lo_begin, j - lo_begin);
      std::string_view hi_digits;
      bool comma = false, valid = !lo_digits.empty() && j < n;
      if (valid && re[j] == ',') {
        comma = true;
        const size_t hi_begin = ++j;
        while (j < n && std::isdigit(static_cast<unsigned char>(re[j]))) ++j;
        hi_digits = re.substr(hi_begin, j - hi_begin);
      }
      valid = valid && j < n && re[j] == '}';
      if (!valid) {
        ++i;
        add_item(1, 1);
        continue;
      }
      for (std::string_view digits : {lo_digits, hi_digits}) {
        if (!digits.empty() && read_count(digits) > limits.max_repetition_bound) {
          const std::string shown = digits.size() > 24 ? std::string(digits.substr(0, 24)) + "..." : std::string(digits);
          return invalid_argument(limit_error("regex repetition bound", shown, limits.max_repetition_bound, where));
        }
      }
      const int64_t lower = read_count(lo_digits);
      const int64_t upper = !comma ? lower : hi_digits.empty() ? -1 : read_count(hi_digits);
      i = j + 1;
      if (i < n && re[i] == '?') ++i;
      CEDAR_RETURN_IF_ERROR(quantify(lower, upper));
    } else if (c == '|' || c == '^' || c == '$') {
      ++i;
    } else {
      // A literal: one atom per character (UTF-8 continuation bytes belong to the character before).
      ++i;
      while (i < n && (static_cast<unsigned char>(re[i]) & 0xC0) == 0x80) ++i;
      add_item(1, 1);
    }
    if (stack.back().size > limits.max_regex_expansion)
      return invalid_argument(limit_error("regex size with its repetitions unrolled", std::to_string(stack.back().size),
                                          limits.max_regex_expansion, where));
  }
  // Unclosed groups (xgrammar reports them) still count.
  int64_t total = 0;
  for (const Group& g : stack) total = std::min(kSaturated, total + g.size);
  if (total > limits.max_regex_expansion)
    return invalid_argument(
        limit_error("regex size with its repetitions unrolled", std::to_string(total), limits.max_regex_expansion, where));
  return Status::ok_status();
}

Status check_constraint(const ConstraintSpec& spec, std::string_view field, const ConstraintLimits& limits) {
  const std::string where = !field.empty()                       ? std::string(field)
                            : spec.kind == ConstraintKind::kRegex ? std::string("the regex")
                            : spec.kind == ConstraintKind::kJson  ? std::string("the JSON schema")
                                                                  : std::string("tools");
  if (spec.text.size() > limits.max_text_bytes)
    return invalid_argument(limit_error("constraint size", std::to_string(spec.text.size()) + " bytes",
                                        static_cast<int64_t>(limits.max_text_bytes), where));
  switch (spec.kind) {
    case ConstraintKind::kRegex:
      return check_regex(spec.text, where, limits);
    case ConstraintKind::kJson: {
      if (spec.text.empty()) return Status::ok_status();  // json_object: cedar's own fixed schema
      const json schema = json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return invalid_argument("the JSON schema is not valid JSON (" + where + ")");
      return check_json_schema(schema, SchemaUse::kResponse, where, limits);
    }
    case ConstraintKind::kToolCall:
    case ConstraintKind::kToolCallRequired: {
      const json tools = json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      if (tools.is_discarded() || !tools.is_array()) return invalid_argument("the tools are not a JSON array (" + where + ")");
      for (size_t k = 0; k < tools.size(); ++k) {
        const json& tool = tools[k];
        if (!tool.is_object() || !tool.contains("parameters") || tool["parameters"].is_null()) continue;
        const std::string name = tool.contains("name") && tool["name"].is_string() ? tool["name"].get<std::string>() : "";
        const std::string tool_where = where + "[" + std::to_string(k) + "] '" + name + "' parameters";
        CEDAR_RETURN_IF_ERROR(check_json_schema(tool["parameters"], SchemaUse::kToolParameters, tool_where, limits));
      }
      return Status::ok_status();
    }
  }
  return Status::ok_status();
}

std::string sanitize_grammar_error(std::string_view message) {
  std::string text(message);
  // Stack traces (cpptrace's "Stack trace (most recent call first):" and the like) end the reason.
  for (std::string_view marker : {"Stack trace", "stack trace", "Traceback", "\n#0 "}) {
    if (const size_t at = text.find(marker); at != std::string::npos) text.resize(at);
  }
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    // "[hh:mm:ss] " (xgrammar's log prefix).
    if (text[i] == '[' && i + 10 <= text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1])) &&
        text[i + 3] == ':' && text[i + 6] == ':' && text[i + 9] == ']') {
      i += 10;
      while (i < text.size() && text[i] == ' ') ++i;
      continue;
    }
    // A source location: a run without spaces ending in ".cc:123", ".h:45", ".cpp:6", then ": ".
    const size_t word_end = std::min(text.find_first_of(" \n\t", i), text.size());
    const std::string_view word(text.data() + i, word_end - i);
    const size_t colon = word.rfind(':', word.size() > 1 ? word.size() - 2 : 0);
    if (colon != std::string_view::npos && colon > 0) {
      const std::string_view file = word.substr(0, colon);
      std::string_view line = word.substr(colon + 1);
      if (line.ends_with(':')) line.remove_suffix(1);
      const bool numeric = !line.empty() && std::all_of(line.begin(), line.end(), [](char d) { return std::isdigit(static_cast<unsigned char>(d)); });
      if (numeric && (file.ends_with(".cc") || file.ends_with(".h") || file.ends_with(".cpp") || file.ends_with(".hpp"))) {
        i = word_end;
        while (i < text.size() && text[i] == ' ') ++i;
        continue;
      }
    }
    out.append(word);
    i = word_end;
    if (i < text.size()) out += text[i++];
  }
  // Collapse new lines and trailing white space into one line.
  for (char& ch : out)
    if (ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
  while (!out.empty() && out.back() == ' ') out.pop_back();
  size_t start = 0;
  while (start < out.size() && out[start] == ' ') ++start;
  return out.substr(start);
}

}  // namespace cedar::constrain
