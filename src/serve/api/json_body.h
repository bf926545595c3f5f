// A JSON parser for request bodies whose cost is linear in the body and bounded in memory.
//
// nlohmann::ordered_json's own parse inserts each object member with a linear search for a duplicate
// key, so an object of n keys costs O(n^2) (400k keys: 160 s of CPU), and nothing bounds how much
// memory the DOM takes per body byte (a 16 MB body of `[{},{},...]` becomes ~350 MB). This parser
// drives nlohmann's SAX reader (iterative, no recursion) and builds the same ordered_json DOM itself:
//   - object members are appended without a search; duplicates are found with a linear scan while an
//     object is small and an open-addressing index of member positions (4 bytes a slot) once it is
//     larger, so the whole parse is O(body);
//   - a duplicate key keeps its first position and takes the last value, as Python's json (and so
//     DeepSeek's API) does;
//   - limits are checked as the events come: nesting depth, keys per object, values per body, string
//     length, and the DOM's estimated bytes (containers' real capacities, heap strings, the index)
//     against `memory_factor` x body + `memory_slack`;
//   - a cancellation check (the client left) runs every kCancelCheckEvents events.
// simdjson was considered for a first pass: its parsers keep a 4-byte structural index per input byte
// (plus a tape of ~8 bytes per value for the DOM API), which alone is over the 4x memory goal on dense
// bodies, and the ordered_json DOM the schemas read would still have to be built afterwards.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "serve/api/chat_types.h"

namespace cedar::serve {

struct JsonLimits {
  int max_depth = 64;                   // nested objects/arrays (schema_util.h's kMaxJsonDepth)
  size_t max_object_keys = 10000;       // members of one object
  size_t max_values = 1u << 20;         // values of every kind in one text
  size_t max_string_bytes = 16u << 20;  // one string or key, after unescaping
  size_t memory_factor = 4;             // the DOM may take memory_factor x the text's bytes
  size_t memory_slack = 1u << 20;       // + this much (small bodies)
};

// What a parse counted (tests, the benchmark).
struct JsonParseStats {
  size_t values = 0;
  size_t estimated_bytes = 0;  // the DOM's estimated heap bytes when parsing stopped
};

struct JsonError {
  enum class Kind { kSyntax, kLimit, kCancelled } kind;
  std::string message;  // in words fit for a 400
};

// Every this many values the cancellation check runs.
inline constexpr size_t kCancelCheckEvents = 4096;

// Parses `text` into *out. Returns nothing on success, else the reason (naming the limit that was hit,
// or the syntax error's byte offset). `what` names the text in messages ("the
// request body"). `cancelled` (may be empty) is polled; when it returns true the parse stops with
// kCancelled.
std::optional<JsonError> parse_json_bounded(std::string_view text, const JsonLimits& limits, OrderedJson* out,
                                              std::string_view what = "the request body",
                                              const std::function<bool()>& cancelled = {},
                                              JsonParseStats* stats = nullptr);

// Calls fn(c) for every character of a JSON text that lies outside strings, each string's opening
// quote included, until fn returns false: a cheap look at the text's structure without parsing it
// (it does not check the syntax).
template <typename Fn>
void scan_json_outside_strings(std::string_view text, Fn&& fn) {
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (!fn(c)) return;
  }
}

}  // namespace cedar::serve
