#include "constrain/constraint_limits.h"

#include <algorithm>
#include <bitset>
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

// A character set over ASCII, with [128] standing for every non-ASCII character.
using CharSet = std::bitset<129>;

CharSet all_chars() { return CharSet().set(); }

CharSet range_set(int from, int to) {
  CharSet s;
  for (int c = from; c <= to; ++c) s.set(static_cast<size_t>(c));
  return s;
}

// What a regex item (an atom, a group, a quantified item) costs and can match.
struct Item {
  int64_t size = 0;       // atoms with every repetition unrolled
  int64_t chain = 1;      // the largest product of nested repetition bounds
  int64_t ambiguity = 1;  // the largest product of bounds of counted repetitions of ambiguous parts
  int64_t vbound = 1;     // the bound of the variable-length repetitions inside, for the next level
  int64_t min_len = 0, max_len = 0;  // in characters; max_len -1: unbounded
  int first = -1, last = -1;         // the ASCII literal it always starts / ends with
  CharSet chars;                     // every character it can match
  CharSet vchars;                    // ... within its variable-length parts
  bool variable() const { return max_len != min_len; }
};

Item atom(const CharSet& chars, int literal) {
  Item x;
  x.size = 1;
  x.min_len = x.max_len = 1;
  x.first = x.last = literal;
  x.chars = chars;
  return x;
}

int64_t add_len(int64_t a, int64_t b) { return a < 0 || b < 0 ? -1 : std::min(kSaturated, a + b); }

Item concat(const Item& a, const Item& b) {
  if (a.size == 0 && a.max_len == 0) return b;
  Item x;
  x.size = std::min(kSaturated, a.size + b.size);
  x.chain = std::max(a.chain, b.chain);
  x.ambiguity = std::max(a.ambiguity, b.ambiguity);
  x.vbound = std::max(a.vbound, b.vbound);
  x.min_len = std::min(kSaturated, a.min_len + b.min_len);
  x.max_len = add_len(a.max_len, b.max_len);
  x.first = a.min_len > 0 ? a.first : -1;
  x.last = b.min_len > 0 ? b.last : -1;
  x.chars = a.chars | b.chars;
  x.vchars = a.vchars | b.vchars;
  return x;
}

Item alternative(const Item& a, const Item& b) {
  Item x = concat(a, b);
  x.size = std::min(kSaturated, a.size + b.size);
  x.min_len = std::min(a.min_len, b.min_len);
  x.max_len = a.max_len < 0 || b.max_len < 0 ? -1 : std::max(a.max_len, b.max_len);
  x.first = a.first == b.first && a.min_len > 0 && b.min_len > 0 ? a.first : -1;
  x.last = a.last == b.last && a.min_len > 0 && b.min_len > 0 ? a.last : -1;
  if (x.variable()) x.vchars = x.chars;  // which branch takes a character is a choice too
  return x;
}

// The characters an escape outside or inside a class matches, and its literal (-1: a class or unknown).
CharSet escape_set(char e, int* literal) {
  *literal = -1;
  switch (e) {
    case 'd': return range_set('0', '9');
    case 'w': return range_set('a', 'z') | range_set('A', 'Z') | range_set('0', '9') | range_set('_', '_');
    case 's': return range_set(' ', ' ') | range_set('\t', '\r');
    case 'n': *literal = '\n'; return range_set('\n', '\n');
    case 't': *literal = '\t'; return range_set('\t', '\t');
    case 'r': *literal = '\r'; return range_set('\r', '\r');
    case 'f': *literal = '\f'; return range_set('\f', '\f');
    case 'v': *literal = '\v'; return range_set('\v', '\v');
    default: break;
  }
  if (std::isalnum(static_cast<unsigned char>(e)) || static_cast<unsigned char>(e) >= 0x80) return all_chars();  // \D, \x41, \u{..}, ...
  *literal = static_cast<unsigned char>(e);
  return range_set(e, e);
}

// The characters of a class body (between `[` and `]`).
CharSet class_set(std::string_view body) {
  if (!body.empty() && body[0] == '^') return all_chars();
  CharSet s;
  for (size_t i = 0; i < body.size(); ++i) {
    int lo;
    if (body[i] == '\\' && i + 1 < body.size()) {
      int literal;
      const CharSet e = escape_set(body[++i], &literal);
      s |= e;
      if (literal < 0) continue;
      lo = literal;
    } else if (static_cast<unsigned char>(body[i]) >= 0x80) {
      s.set(128);
      continue;
    } else {
      lo = static_cast<unsigned char>(body[i]);
      s.set(static_cast<size_t>(lo));
    }
    if (i + 2 < body.size() && body[i + 1] == '-' && body[i + 2] != '\\') {
      const unsigned char hi = static_cast<unsigned char>(body[i + 2]);
      if (hi >= 0x80) s.set(128);
      s |= range_set(lo, std::min<int>(hi, 127));
      i += 2;
    }
  }
  return s;
}

// One open group: the items of its current alternative, and the alternatives before it.
struct Group {
  Item sequence;  // the items before the last
  Item last;      // what a quantifier applies to
  bool has_last = false;
  Item alternatives;
  bool has_alternatives = false;
  Item current() const { return has_last ? concat(sequence, last) : sequence; }
  void push(const Item& x) {
    if (has_last) sequence = concat(sequence, last);
    last = x;
    has_last = true;
  }
  Item close() const { return has_alternatives ? alternative(alternatives, current()) : current(); }
};

}  // namespace

// The scan follows the syntax xgrammar's regex converter (regex_converter.cc) reads: literals,
// escapes (`\d`, `\x41`, `\u{1F600}`, ...), classes `[...]` (escapes inside; `]` ends them), groups
// `(`, `(?:`, `(?<name>`, alternation and the quantifiers `*`, `+`, `?`, `{n}`, `{n,}`, `{n,m}`
// (each with an optional lazy `?`). A `{` that does not open a valid count is a literal here;
// xgrammar reports it. Syntax errors are left to xgrammar: this pass only bounds the cost.
//
// Two costs are bounded. Compiling: xgrammar unrolls a counted repetition into max(n, m) copies,
// so bounds multiply when nested. Matching: a part of variable length repeated a counted number
// of times, `([a-z ]{0,10}){0,10}`, can split the text among its copies in many ways, and xgrammar's
// parser follows them all: 240 ms per token there, 2.6 s for `(.{0,7}){0,7}`, on a 2-core VM. A
// part that starts or ends with a literal its variable part cannot match (`( [a-z]{1,6}){0,3}`,
// `(\d{1,3}\.){3}`) splits one way only and is not counted.
Status check_regex(std::string_view re, std::string_view where, const ConstraintLimits& limits) {
  if (re.size() > limits.max_regex_bytes)
    return invalid_argument(limit_error("regex length", std::to_string(re.size()) + " bytes", limits.max_regex_bytes, where));
  std::vector<Group> stack(1);
  // A quantifier with bounds [lower, upper] (upper -1: none) on the last item.
  auto quantify = [&](int64_t lower, int64_t upper) -> Status {
    Group& g = stack.back();
    if (!g.has_last) return Status::ok_status();
    const Item x = g.last;
    // xgrammar unrolls max(lower, upper) copies ({n,} is n copies and a loop).
    const int64_t copies = std::max<int64_t>(1, std::max(lower, upper));
    Item y = x;
    y.chain = saturating_mul(x.chain, copies);
    if (y.chain > limits.max_repetition_product)
      return invalid_argument(limit_error("regex nested repetition product", std::to_string(y.chain),
                                          limits.max_repetition_product, where));
    y.size = saturating_mul(x.size, copies);
    const bool counted = copies > 1;
    const bool delimited = (x.first >= 0 && !x.vchars[static_cast<size_t>(x.first)]) ||
                           (x.last >= 0 && !x.vchars[static_cast<size_t>(x.last)]);
    if (counted && x.variable() && !delimited) {
      y.vbound = saturating_mul(x.vbound, copies);
      y.ambiguity = std::max(x.ambiguity, y.vbound);
      if (y.vbound > limits.max_ambiguous_repetition)
        return invalid_argument("regex product of counted repetitions over a variable-length part " +
                                std::to_string(y.vbound) + " exceeds the limit of " +
                                std::to_string(limits.max_ambiguous_repetition) +
                                ": the copies can split the text in many ways, each costly to follow; delimit the part "
                                "by a character it cannot hold, as in ( [a-z]{1,6}){0,5} (" + std::string(where) + ")");
    } else if (lower != upper) {
      y.vbound = std::max(x.vbound, copies);
    }
    y.min_len = saturating_mul(x.min_len, lower);
    y.max_len = upper < 0 || x.max_len < 0 ? (x.max_len == 0 ? 0 : -1) : saturating_mul(x.max_len, upper);
    if (lower != upper) y.vchars = x.chars;
    if (lower == 0) y.first = y.last = -1;
    g.last = y;
    return Status::ok_status();
  };
  size_t i = 0;
  const size_t n = re.size();
  while (i < n) {
    const char c = re[i];
    if (c == '\\') {
      // An escape is one atom; \u{...}, \p{...} and \P{...} carry braces that are not a count.
      int literal = -1;
      const CharSet set = i + 1 < n ? escape_set(re[i + 1], &literal) : all_chars();
      size_t end = std::min(n, i + 2);
      if (i + 2 < n && (re[i + 1] == 'u' || re[i + 1] == 'p' || re[i + 1] == 'P') && re[i + 2] == '{') {
        const size_t close = re.find('}', i + 3);
        end = close == std::string_view::npos ? n : close + 1;
      }
      i = end;
      stack.back().push(atom(set, literal));
    } else if (c == '[') {
      size_t j = i + 1;
      if (j < n && re[j] == '^') ++j;
      if (j < n && re[j] == ']') ++j;  // a leading `]` (xgrammar refuses the empty class; it stays one atom here)
      while (j < n && re[j] != ']') j += re[j] == '\\' ? 2 : 1;
      const std::string_view body = re.substr(i + 1, std::min(n, j) - (i + 1));
      i = std::min(n, j + 1);
      stack.back().push(atom(class_set(body), -1));
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
      const Item inner = stack.back().close();
      stack.pop_back();
      stack.back().push(inner);
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
        stack.back().push(atom(range_set('{', '{'), '{'));
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
    } else if (c == '|') {
      ++i;
      Group& g = stack.back();
      g.alternatives = g.has_alternatives ? alternative(g.alternatives, g.current()) : g.current();
      g.has_alternatives = true;
      g.sequence = Item();
      g.has_last = false;
    } else if (c == '^' || c == '$') {
      ++i;
    } else if (c == '.') {
      ++i;
      stack.back().push(atom(all_chars(), -1));
    } else {
      // A literal: one atom per character (UTF-8 continuation bytes belong to the character before).
      const unsigned char first = static_cast<unsigned char>(c);
      ++i;
      while (i < n && (static_cast<unsigned char>(re[i]) & 0xC0) == 0x80) ++i;
      stack.back().push(first < 0x80 ? atom(range_set(first, first), first) : atom(range_set(128, 128), -1));
    }
  }
  // Unclosed groups (xgrammar reports them) still count.
  int64_t total = 0;
  for (const Group& g : stack) total = std::min(kSaturated, total + g.close().size);
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
