// Limits on an output constraint, checked before any grammar work (issue 35), and the JSON Schema
// keywords cedar enforces.
//
// xgrammar compiles what it is given: a repetition bound becomes that many copies of its operand
// (`a{99999999999}` allocates until the process dies; `(a{1000}){1000}` compiles into a grammar
// that costs ~190 ms per token inside the shared batch step), and a JSON Schema `maxLength`,
// `minItems` or integer range becomes such a repetition. check_constraint() reads the constraint's
// text first, cheaply and linearly, and refuses what would be costly with InvalidArgument naming the
// limit and the value. GrammarEngine::start() calls it; the server calls it too, before admission.
//
// It also refuses the JSON Schema keywords xgrammar 0.2.9 would accept but not enforce (its
// json_schema_converter.cc ignores them, with a log line at most): `not`, `if`/`then`/`else`,
// `dependentRequired`, `dependentSchemas`, `contains`, `uniqueItems`, `allOf` with more than one
// schema, `oneOf` whose branches it cannot prove disjoint (it falls back to anyOf), `multipleOf` on
// numbers, keywords beside `$ref` / `anyOf` / `oneOf` / `allOf` (xgrammar reads only those), ...;
// and schemas that accept no value (`false`, `{"enum": []}`, `type: []`, `anyOf: [{"$ref": "#"}]`).
// Annotations (`title`, `description`, `examples`, `default`, `$comment`, ...) and keywords that
// JSON Schema does not define are accepted: JSON Schema ignores unknown keywords too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "constrain/grammar_engine.h"
#include "core/status.h"

namespace cedar::constrain {

// The defaults are documented in docs/SERVER.md ("Constraint limits"). They leave room for real
// agent schemas (hundreds of properties, formats, patterns such as `\d{4}-\d{2}`) while keeping one
// constraint's compilation to well under a second and its per-token mask cost small.
struct ConstraintLimits {
  size_t max_text_bytes = 512 * 1024;         // the whole constraint: regex, schema or tools JSON
  size_t max_regex_bytes = 16 * 1024;         // one regex: response_format regex, `pattern`, a patternProperties key
  int64_t max_repetition_bound = 1000;        // each n, m of {n}, {n,}, {n,m}
  int64_t max_repetition_product = 10000;     // the product of nested bounds: (a{100}){100}
  int64_t max_regex_expansion = 100000;       // the regex's atoms with every repetition unrolled
  // Counted repetitions over a part of variable length that no literal delimits, `([a-z ]{0,4}){0,2}`:
  // the product of their bounds (the ways the text can split, which the parser follows per token).
  int64_t max_ambiguous_repetition = 8;
  int max_group_depth = 32;                   // nested groups in one regex
  int max_schema_depth = 32;                  // nested subschemas
  int64_t max_schema_nodes = 10000;           // subschemas in one schema (each property's, each branch's, ...)
  int64_t max_object_properties = 500;        // properties of one object (xgrammar's cost grows faster than linearly)
  int64_t max_enum_values = 1000;             // values of one enum
  int64_t max_string_length_bound = 10000;    // minLength / maxLength
  int64_t max_items_bound = 1000;             // minItems / maxItems, minProperties / maxProperties
};

// OK, or InvalidArgument naming the limit (or the keyword) and where it is, e.g. "regex repetition
// bound 99999999999 exceeds the limit of 1000 (response_format.regex)". `field` names the
// constraint on the wire ("response_format", "text.format", "tools", ...).
Status check_constraint(const ConstraintSpec& spec, std::string_view field, const ConstraintLimits& limits = {});

// The checks on one regex alone; `where` ends the message.
Status check_regex(std::string_view regex, std::string_view where, const ConstraintLimits& limits = {});

// A message from xgrammar (an exception's text) as a client may see it: without the "[hh:mm:ss]"
// prefix, source paths and line numbers ("/build/.../regex_converter.cc:95: "), stack traces and
// trailing white space.
std::string sanitize_grammar_error(std::string_view message);

}  // namespace cedar::constrain
