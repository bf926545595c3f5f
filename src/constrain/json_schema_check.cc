// What xgrammar 0.2.9 enforces, read from its json_schema_converter.cc (SchemaParser::Parse and the
// Parse* methods it dispatches to):
//   - A subschema is read by the first of `$ref`, `const`, `enum`, `anyOf`, `oneOf`, `allOf`, `type`,
//     then object keywords, then array keywords; every other keyword beside the one chosen is
//     dropped. So keywords beside `$ref` / `anyOf` / `oneOf` / `allOf` are refused here, and beside
//     `const` / `enum` only `type` is kept (checked against the values).
//   - Strings: `pattern`, the builtin `format`s (kBuiltinFormats), `minLength`, `maxLength`; lengths
//     are dropped beside a pattern or a builtin format. (0.2.9 drops them in tool parameters too,
//     where the DSML grammar excludes the closing marker from strings; cedar's local fix 2 in
//     cmake/Xgrammar.cmake enforces them there.)
//   - Integers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`; `multipleOf` only when
//     an integer <= 1024 and either unbounded or bounded on both sides by a range of <= 10000.
//     Numbers: the bounds; `multipleOf` dropped.
//   - Arrays: `items`, `prefixItems`, `unevaluatedItems`, `minItems`, `maxItems`. `uniqueItems`,
//     `contains`, `minContains`, `maxContains` dropped (minContains even raises minItems).
//   - Objects: `properties`, `required`, `patternProperties`, `propertyNames`, `additionalProperties`,
//     `unevaluatedProperties`, `minProperties`, `maxProperties`.
//   - `oneOf` only when its branches are provably disjoint (a discriminator property, or distinct
//     types or values); else it is read as `anyOf`. `allOf` only with one schema; else anything.
//   - `not`, `if`, `then`, `else`, `dependentRequired`, `dependentSchemas` are dropped with a warning.
//   - `$ref` only to "#" or "#/..." (else anything).
#include "constrain/json_schema_check.h"

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace cedar::constrain {
namespace {

using json = nlohmann::json;

// JSON Schema's validation and applicator keywords (2020-12, with draft-07's `dependencies`,
// `additionalItems`, `definitions` and 2019-09's `$recursiveRef`): the ones that constrain a value.
const std::set<std::string>& constraining_keywords() {
  static const std::set<std::string> k = {
      "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
      "maxLength", "minLength", "pattern", "format", "maxItems", "minItems", "uniqueItems", "maxContains",
      "minContains", "maxProperties", "minProperties", "required", "dependentRequired", "allOf", "anyOf",
      "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies", "prefixItems", "items",
      "additionalItems", "contains", "properties", "patternProperties", "additionalProperties", "propertyNames",
      "unevaluatedItems", "unevaluatedProperties", "$ref", "$dynamicRef", "$recursiveRef"};
  return k;
}

// Refused wherever they appear: xgrammar drops them (or, for minContains, misreads it).
const std::set<std::string>& unenforced_keywords() {
  static const std::set<std::string> k = {"not",          "if",          "then",          "else",
                                          "dependentRequired", "dependentSchemas", "dependencies",
                                          "contains",     "minContains", "maxContains",   "additionalItems",
                                          "$dynamicRef",  "$recursiveRef"};
  return k;
}

// xgrammar's builtin formats (JSONFormatToRegexPattern); the other formats JSON Schema defines are
// refused, and formats it does not define are annotations, as JSON Schema reads them.
const std::set<std::string>& builtin_formats() {
  static const std::set<std::string> k = {"email", "date", "time", "date-time", "duration", "ipv4", "ipv6",
                                          "hostname", "uuid", "uri", "uri-reference", "uri-template",
                                          "json-pointer", "relative-json-pointer"};
  return k;
}
const std::set<std::string>& unsupported_standard_formats() {
  static const std::set<std::string> k = {"idn-email", "idn-hostname", "iri", "iri-reference", "regex"};
  return k;
}

const std::set<std::string> kObjectKeywords = {"properties",   "required",      "patternProperties",
                                               "propertyNames", "additionalProperties", "unevaluatedProperties",
                                               "minProperties", "maxProperties"};
const std::set<std::string> kArrayKeywords = {"items", "prefixItems", "unevaluatedItems", "minItems", "maxItems",
                                              "uniqueItems"};

std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

bool value_matches_type(const json& v, const std::string& type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (type == "array") return v.is_array();
  if (type == "object") return v.is_object();
  return false;
}

std::vector<std::string> type_list(const json& s) {
  std::vector<std::string> out;
  if (!s.is_object() || !s.contains("type")) return out;
  const json& t = s["type"];
  if (t.is_string()) out.push_back(t.get<std::string>());
  if (t.is_array())
    for (const json& e : t)
      if (e.is_string()) out.push_back(e.get<std::string>());
  return out;
}

// Finite values of a const / enum subschema, or none.
bool finite_values(const json& s, std::vector<json>* out) {
  if (!s.is_object()) return false;
  if (s.contains("const")) {
    out->push_back(s["const"]);
    return true;
  }
  if (s.contains("enum") && s["enum"].is_array() && !s["enum"].empty()) {
    for (const json& v : s["enum"]) out->push_back(v);
    return true;
  }
  return false;
}

// Two values xgrammar might not tell apart: equal, or both numbers (1 and 1.0; conservative).
bool may_overlap(const json& a, const json& b) { return (a.is_number() && b.is_number()) || a == b; }

bool values_overlap(const std::vector<json>& a, const std::vector<json>& b) {
  for (const json& x : a)
    for (const json& y : b)
      if (may_overlap(x, y)) return true;
  return false;
}

// A sufficient condition for xgrammar's own proof of a disjoint oneOf (TryProvePairwiseDisjointOneOf):
// a property every branch requires whose values differ, or branches that are each a set of values
// or a bare `type` (not object) with no overlap. Where this finds no proof, the oneOf is refused.
bool provably_disjoint(const json& options) {
  if (!options.is_array() || options.empty()) return false;
  auto annotations_only_besides = [](const json& s, const std::string& key) {
    for (auto it = s.begin(); it != s.end(); ++it)
      if (it.key() != key && constraining_keywords().contains(it.key())) return false;
    return true;
  };
  // A discriminator: required in every branch, a const / enum property, values pairwise apart.
  const json& first = options[0];
  if (first.is_object() && first.contains("required") && first["required"].is_array()) {
    for (const json& key : first["required"]) {
      if (!key.is_string()) continue;
      std::vector<std::vector<json>> values;
      for (const json& option : options) {
        if (!option.is_object() || option.contains("$ref") || option.contains("anyOf") || option.contains("allOf") ||
            option.contains("oneOf") || option.value("type", json()) != "object" || !option.contains("required") ||
            !option["required"].is_array() || !option.contains("properties") || !option["properties"].is_object())
          break;
        bool required = false;
        for (const json& r : option["required"]) required = required || r == key;
        const json& props = option["properties"];
        std::vector<json> v;
        if (!required || !props.contains(key.get<std::string>()) || !finite_values(props[key.get<std::string>()], &v)) break;
        values.push_back(std::move(v));
      }
      if (values.size() != options.size()) continue;
      bool apart = true;
      for (size_t i = 0; i < values.size() && apart; ++i)
        for (size_t j = i + 1; j < values.size() && apart; ++j) apart = !values_overlap(values[i], values[j]);
      if (apart) return true;
    }
  }
  // Values or bare types.
  struct Arm {
    std::vector<json> values;
    std::vector<std::string> types;
  };
  std::vector<Arm> arms;
  for (const json& option : options) {
    if (!option.is_object() || option.contains("$ref") || option.contains("anyOf") || option.contains("allOf") ||
        option.contains("oneOf"))
      return false;
    Arm arm;
    if (!finite_values(option, &arm.values)) {
      if (!option.contains("type") || !annotations_only_besides(option, "type")) return false;
      arm.types = type_list(option);
      if (arm.types.empty()) return false;
      for (const std::string& t : arm.types)
        if (t == "object") return false;
    }
    arms.push_back(std::move(arm));
  }
  auto numeric = [](const std::string& t) { return t == "integer" || t == "number"; };
  auto overlap = [&](const Arm& a, const Arm& b) {
    if (!a.values.empty() && !b.values.empty()) return values_overlap(a.values, b.values);
    if (a.values.empty() && b.values.empty()) {
      for (const std::string& x : a.types)
        for (const std::string& y : b.types)
          if (x == y || (numeric(x) && numeric(y))) return true;
      return false;
    }
    const Arm& vals = a.values.empty() ? b : a;
    const Arm& types = a.values.empty() ? a : b;
    for (const json& v : vals.values)
      for (const std::string& t : types.types)
        if (value_matches_type(v, t) || (v.is_number() && numeric(t))) return true;
    return false;
  };
  for (size_t i = 0; i < arms.size(); ++i)
    for (size_t j = i + 1; j < arms.size(); ++j)
      if (overlap(arms[i], arms[j])) return false;
  return true;
}

class SchemaChecker {
 public:
  SchemaChecker(const json& root, SchemaUse use, std::string_view where, const ConstraintLimits& limits)
      : root_(root), use_(use), where_(where), limits_(limits) {}

  Status run() {
    CEDAR_RETURN_IF_ERROR(walk(root_, "#", 0, /*may_be_false=*/false));
    // Subschemas reached only through a $ref (under a keyword this walk does not enter).
    while (!pending_refs_.empty()) {
      const std::string ref = *pending_refs_.begin();
      pending_refs_.erase(pending_refs_.begin());
      const json* target = resolve(ref);
      if (target && !walked_.contains(ref)) CEDAR_RETURN_IF_ERROR(walk(*target, ref, 0, false));
    }
    // Which $ref targets accept some value: the least fixed point, so a reference that only leads
    // back to itself (anyOf: [{"$ref": "#"}]) accepts nothing.
    std::map<std::string, const json*> targets;
    for (const auto& [ref, sat] : satisfiable_refs_) targets[ref] = resolve(ref);
    for (bool changed = true; changed && satisfiable_steps_ <= kMaxSatisfiableSteps;) {
      changed = false;
      for (auto& [ref, sat] : satisfiable_refs_) {
        if (sat) continue;
        const json* target = targets[ref];
        if (target && satisfiable(*target)) sat = changed = true;
      }
    }
    const bool root_satisfiable = satisfiable(root_);
    if (satisfiable_steps_ > kMaxSatisfiableSteps)
      return invalid_argument("the schema's $ref graph needs more than " + std::to_string(kMaxSatisfiableSteps) +
                              " steps to check; use fewer references (" + where_ + ")");
    if (!root_satisfiable)
      return invalid_argument("the schema accepts no value: a required property, a required array item or every "
                              "branch of an anyOf accepts nothing (e.g. `false`, `\"type\": []`, or a `$ref` that only "
                              "leads back to itself) (" + where_ + ")");
    return Status::ok_status();
  }

 private:
  Status fail(const std::string& path, const std::string& message) const {
    return invalid_argument(message + " (" + where_ + ", at " + path + ")");
  }
  Status refuse_keyword(const std::string& path, const std::string& key, const std::string& why) const {
    return fail(path, "JSON Schema keyword '" + key + "' is not enforced by this server's constrained decoding" +
                          (why.empty() ? "" : " (" + why + ")") + "; remove it or express it with supported keywords");
  }
  Status bound(const std::string& path, const json& s, const char* key, int64_t limit) const {
    if (!s.contains(key)) return Status::ok_status();
    const json& v = s[key];
    if (!v.is_number()) return fail(path, std::string("'") + key + "' must be a number");
    if (v.get<double>() > static_cast<double>(limit))
      return fail(path, std::string("'") + key + "' " + v.dump() + " exceeds the limit of " + std::to_string(limit));
    return Status::ok_status();
  }

  const json* resolve(const std::string& ref) const {
    if (ref == "#") return &root_;
    if (!ref.starts_with("#/")) return nullptr;
    std::string pointer;
    for (size_t i = 1; i < ref.size(); ++i) {
      if (ref[i] == '%' && i + 2 < ref.size() && std::isxdigit(static_cast<unsigned char>(ref[i + 1])) &&
          std::isxdigit(static_cast<unsigned char>(ref[i + 2]))) {
        pointer += static_cast<char>(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        pointer += ref[i];
      }
    }
    try {
      const json::json_pointer p(pointer);
      return root_.contains(p) ? &root_.at(p) : nullptr;
    } catch (const std::exception&) {
      return nullptr;
    }
  }

  Status walk_child(const json& s, const std::string& path, int depth, bool may_be_false = false) {
    return walk(s, path, depth + 1, may_be_false);
  }

  Status walk(const json& s, const std::string& path, int depth, bool may_be_false) {
    walked_.insert(path);
    if (++nodes_ > limits_.max_schema_nodes)
      return fail(path, "the schema has more than " + std::to_string(limits_.max_schema_nodes) +
                            " subschemas, the limit");
    if (depth > limits_.max_schema_depth)
      return fail(path, "schema nesting depth " + std::to_string(depth) + " exceeds the limit of " +
                            std::to_string(limits_.max_schema_depth));
    if (s.is_boolean()) {
      if (!s.get<bool>() && !may_be_false) return fail(path, "the schema `false` accepts no value");
      return Status::ok_status();
    }
    if (!s.is_object()) return fail(path, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (unenforced_keywords().contains(it.key())) return refuse_keyword(path, it.key(), "");
      if (it.key() == "uniqueItems" && it.value() != false) return refuse_keyword(path, "uniqueItems", "true");
    }
    for (const char* defs : {"$defs", "definitions"}) {
      if (!s.contains(defs) || !s[defs].is_object()) continue;
      for (auto it = s[defs].begin(); it != s[defs].end(); ++it)
        CEDAR_RETURN_IF_ERROR(walk_child(it.value(), path + "/" + defs + "/" + pointer_token(it.key()), depth));
    }
    // The keyword xgrammar reads this subschema by (SchemaParser::Parse's order).
    std::string reader;
    for (const char* k : {"$ref", "const", "enum", "anyOf", "oneOf", "allOf"})
      if (s.contains(k)) {
        reader = k;
        break;
      }
    if (!reader.empty()) {
      for (auto it = s.begin(); it != s.end(); ++it) {
        const std::string& key = it.key();
        if (key == reader || !constraining_keywords().contains(key)) continue;
        if ((reader == "const" || reader == "enum") && key == "type") continue;
        return refuse_keyword(path, key, "beside '" + reader + "', which is the only keyword read there");
      }
    }
    if (reader == "$ref") {
      const json& ref = s["$ref"];
      if (!ref.is_string()) return fail(path, "'$ref' must be a string");
      const std::string r = ref.get<std::string>();
      if (!resolve(r))
        return fail(path, "'$ref' " + ref.dump() + " does not resolve: only references within the schema (\"#\", \"#/...\") are supported");
      satisfiable_refs_.emplace(r, false);
      if (!walked_.contains(r)) pending_refs_.insert(r);
      return Status::ok_status();
    }
    if (reader == "const" || reader == "enum") {
      std::vector<json> values;
      if (reader == "enum") {
        if (!s["enum"].is_array()) return fail(path, "'enum' must be an array");
        if (s["enum"].empty()) return fail(path, "'enum' is empty, so the schema accepts no value");
        if (static_cast<int64_t>(s["enum"].size()) > limits_.max_enum_values)
          return fail(path, "'enum' has " + std::to_string(s["enum"].size()) + " values, more than the limit of " +
                                std::to_string(limits_.max_enum_values));
        values.assign(s["enum"].begin(), s["enum"].end());
      } else {
        values.push_back(s["const"]);
      }
      if (s.contains("type")) {
        const std::vector<std::string> types = type_list(s);
        for (const json& v : values) {
          bool ok = false;
          for (const std::string& t : types) ok = ok || value_matches_type(v, t);
          if (!ok) return fail(path, "the " + reader + " value " + v.dump().substr(0, 80) + " does not match 'type' " + s["type"].dump());
        }
      }
      return Status::ok_status();
    }
    if (reader == "anyOf" || reader == "oneOf" || reader == "allOf") {
      const json& options = s[reader];
      if (!options.is_array()) return fail(path, "'" + reader + "' must be an array");
      if (reader == "allOf" && options.size() > 1)
        return refuse_keyword(path, "allOf", "with more than one schema; merge them into one");
      if (reader == "anyOf" && options.empty()) return fail(path, "'anyOf' is empty, so the schema accepts no value");
      if (reader == "oneOf" && !provably_disjoint(options))
        return refuse_keyword(path, "oneOf",
                              "its branches are not provably disjoint, so it would be enforced as anyOf; use anyOf, or "
                              "give every branch a required property with distinct const values");
      for (size_t k = 0; k < options.size(); ++k)
        CEDAR_RETURN_IF_ERROR(walk_child(options[k], path + "/" + reader + "/" + std::to_string(k), depth));
      return Status::ok_status();
    }
    std::vector<std::string> types = type_list(s);
    if (s.contains("type")) {
      if (!s["type"].is_string() && !s["type"].is_array()) return fail(path, "'type' must be a string or an array");
      if (s["type"].is_array() && s["type"].empty()) return fail(path, "'type' is an empty array, so the schema accepts no value");
    } else {
      bool object = false, array = false;
      for (auto it = s.begin(); it != s.end(); ++it) {
        if (it.key() == "properties" || it.key() == "additionalProperties" || it.key() == "unevaluatedProperties") object = true;
        if (it.key() == "items" || it.key() == "prefixItems" || it.key() == "unevaluatedItems") array = true;
      }
      if (object) types = {"object"};
      else if (array) types = {"array"};
      else
        for (auto it = s.begin(); it != s.end(); ++it)
          if (constraining_keywords().contains(it.key()))
            return refuse_keyword(path, it.key(), "without 'type', which it needs to be read");
    }
    for (const std::string& t : types) {
      if (t == "string") CEDAR_RETURN_IF_ERROR(check_string(s, path));
      if (t == "integer" || t == "number") CEDAR_RETURN_IF_ERROR(check_number(s, path, t == "integer"));
      if (t == "array") CEDAR_RETURN_IF_ERROR(check_array(s, path, depth));
      if (t == "object") CEDAR_RETURN_IF_ERROR(check_object(s, path, depth));
    }
    return Status::ok_status();
  }

  Status check_string(const json& s, const std::string& path) {
    const bool pattern = s.contains("pattern");
    std::string format;
    if (s.contains("format")) {
      if (!s["format"].is_string()) return fail(path, "'format' must be a string");
      format = s["format"].get<std::string>();
      if (unsupported_standard_formats().contains(format))
        return refuse_keyword(path, "format", "\"" + format + "\" is not one of the formats it enforces");
    }
    const bool builtin = builtin_formats().contains(format);
    if (pattern && builtin) return refuse_keyword(path, "format", "beside 'pattern', only one of them is enforced");
    // Tool parameters included: the DSML grammar enforces lengths of plain strings (local fix 2 in
    // cmake/Xgrammar.cmake) and drops them beside a pattern or a format, as response formats do.
    const bool lengths = (s.contains("minLength") && s["minLength"] != 0) || s.contains("maxLength");
    if (lengths && (pattern || builtin))
      return refuse_keyword(path, s.contains("maxLength") ? "maxLength" : "minLength",
                            std::string("beside '") + (pattern ? "pattern" : "format") + "'; put the length into the pattern");
    CEDAR_RETURN_IF_ERROR(bound(path, s, "minLength", limits_.max_string_length_bound));
    CEDAR_RETURN_IF_ERROR(bound(path, s, "maxLength", limits_.max_string_length_bound));
    if (pattern) {
      if (!s["pattern"].is_string()) return fail(path, "'pattern' must be a string");
      CEDAR_RETURN_IF_ERROR(check_regex(s["pattern"].get<std::string>(), where_ + ", at " + path + "/pattern", limits_));
    }
    return Status::ok_status();
  }

  Status check_number(const json& s, const std::string& path, bool integer) {
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (s.contains(k) && !s[k].is_number()) return fail(path, std::string("'") + k + "' must be a number");
    if (!s.contains("multipleOf")) return Status::ok_status();
    const json& m = s["multipleOf"];
    if (!m.is_number()) return fail(path, "'multipleOf' must be a number");
    if (!integer) return refuse_keyword(path, "multipleOf", "on a number; use an integer type");
    const double v = m.get<double>();
    if (v <= 0) return fail(path, "'multipleOf' must be greater than 0");
    if (v != std::floor(v) || v > 1024) return refuse_keyword(path, "multipleOf", "it must be an integer of at most 1024");
    const bool low = s.contains("minimum") || s.contains("exclusiveMinimum");
    const bool high = s.contains("maximum") || s.contains("exclusiveMaximum");
    if (low != high) return refuse_keyword(path, "multipleOf", "with a bound on one side only; bound both sides or neither");
    if (low) {
      const double lo = s.contains("minimum") ? s["minimum"].get<double>() : s["exclusiveMinimum"].get<double>();
      const double hi = s.contains("maximum") ? s["maximum"].get<double>() : s["exclusiveMaximum"].get<double>();
      if (hi - lo > 10000) return refuse_keyword(path, "multipleOf", "over a range wider than 10000");
    }
    return Status::ok_status();
  }

  Status check_array(const json& s, const std::string& path, int depth) {
    CEDAR_RETURN_IF_ERROR(bound(path, s, "minItems", limits_.max_items_bound));
    CEDAR_RETURN_IF_ERROR(bound(path, s, "maxItems", limits_.max_items_bound));
    if (s.contains("items")) CEDAR_RETURN_IF_ERROR(walk_child(s["items"], path + "/items", depth, /*may_be_false=*/true));
    if (s.contains("unevaluatedItems"))
      CEDAR_RETURN_IF_ERROR(walk_child(s["unevaluatedItems"], path + "/unevaluatedItems", depth, true));
    if (s.contains("prefixItems") && s["prefixItems"].is_array())
      for (size_t k = 0; k < s["prefixItems"].size(); ++k)
        CEDAR_RETURN_IF_ERROR(walk_child(s["prefixItems"][k], path + "/prefixItems/" + std::to_string(k), depth));
    return Status::ok_status();
  }

  Status check_object(const json& s, const std::string& path, int depth) {
    CEDAR_RETURN_IF_ERROR(bound(path, s, "minProperties", limits_.max_items_bound));
    CEDAR_RETURN_IF_ERROR(bound(path, s, "maxProperties", limits_.max_items_bound));
    const json empty = json::object();
    const json& props = s.contains("properties") && s["properties"].is_object() ? s["properties"] : empty;
    if (static_cast<int64_t>(props.size()) > limits_.max_object_properties)
      return fail(path, "'properties' has " + std::to_string(props.size()) + " entries, more than the limit of " +
                            std::to_string(limits_.max_object_properties));
    for (auto it = props.begin(); it != props.end(); ++it)
      CEDAR_RETURN_IF_ERROR(walk_child(it.value(), path + "/properties/" + pointer_token(it.key()), depth));
    if (s.contains("required") && s["required"].is_array()) {
      for (const json& r : s["required"]) {
        if (!r.is_string()) return fail(path, "'required' must list property names (strings)");
        if (!props.contains(r.get<std::string>()))
          return refuse_keyword(path, "required", "it names '" + r.get<std::string>() +
                                                      "', which 'properties' does not declare; declare it there");
      }
    }
    if (s.contains("patternProperties") && s["patternProperties"].is_object()) {
      const json& pp = s["patternProperties"];
      for (auto it = pp.begin(); it != pp.end(); ++it) {
        const std::string at = path + "/patternProperties/" + pointer_token(it.key());
        CEDAR_RETURN_IF_ERROR(check_regex(it.key(), where_ + ", at " + at, limits_));
        CEDAR_RETURN_IF_ERROR(walk_child(it.value(), at, depth));
      }
    }
    if (s.contains("propertyNames")) {
      const json& names = s["propertyNames"];
      if (names.is_object() && names.contains("pattern") && names["pattern"].is_string())
        CEDAR_RETURN_IF_ERROR(check_regex(names["pattern"].get<std::string>(), where_ + ", at " + path + "/propertyNames/pattern", limits_));
      if (names.is_object() && !names.contains("type")) {
        json as_string = names;  // xgrammar reads it as a string schema
        as_string["type"] = "string";
        CEDAR_RETURN_IF_ERROR(walk_child(as_string, path + "/propertyNames", depth));
      } else {
        CEDAR_RETURN_IF_ERROR(walk_child(names, path + "/propertyNames", depth));
      }
    }
    for (const char* k : {"additionalProperties", "unevaluatedProperties"})
      if (s.contains(k)) CEDAR_RETURN_IF_ERROR(walk_child(s[k], path + "/" + k, depth, /*may_be_false=*/true));
    return Status::ok_status();
  }

  // Whether `s` accepts some value, with $ref targets as satisfiable_refs_ says (checked schemas only).
  bool satisfiable(const json& s) {
    // Bounded work: each round of the fixed point walks the reference targets again.
    if (++satisfiable_steps_ > kMaxSatisfiableSteps) return true;
    if (s.is_boolean()) return s.get<bool>();
    if (!s.is_object()) return true;
    if (s.contains("$ref")) {
      const auto it = s["$ref"].is_string() ? satisfiable_refs_.find(s["$ref"].get<std::string>()) : satisfiable_refs_.end();
      return it != satisfiable_refs_.end() && it->second;
    }
    if (s.contains("const")) return true;
    if (s.contains("enum")) return s["enum"].is_array() && !s["enum"].empty();
    for (const char* k : {"anyOf", "oneOf"}) {
      if (!s.contains(k)) continue;
      if (!s[k].is_array()) return true;
      for (const json& option : s[k])
        if (satisfiable(option)) return true;
      return false;
    }
    if (s.contains("allOf")) {
      if (!s["allOf"].is_array()) return true;
      for (const json& option : s["allOf"])
        if (!satisfiable(option)) return false;
      return true;
    }
    std::vector<std::string> types = type_list(s);
    if (s.contains("type") && s["type"].is_array() && types.empty()) return false;
    if (!s.contains("type")) {
      if (s.contains("properties") || s.contains("additionalProperties") || s.contains("unevaluatedProperties"))
        types = {"object"};
      else if (s.contains("items") || s.contains("prefixItems") || s.contains("unevaluatedItems"))
        types = {"array"};
      else
        return true;
    }
    for (const std::string& t : types) {
      if (t == "object") {
        bool ok = true;
        if (s.contains("required") && s["required"].is_array() && s.contains("properties") && s["properties"].is_object())
          for (const json& r : s["required"])
            if (r.is_string() && s["properties"].contains(r.get<std::string>()))
              ok = ok && satisfiable(s["properties"][r.get<std::string>()]);
        if (ok) return true;
      } else if (t == "array") {
        bool ok = true;
        size_t prefix = 0;
        if (s.contains("prefixItems") && s["prefixItems"].is_array()) {
          prefix = s["prefixItems"].size();
          for (const json& item : s["prefixItems"]) ok = ok && satisfiable(item);
        }
        const double min_items = s.contains("minItems") && s["minItems"].is_number() ? s["minItems"].get<double>() : 0;
        if (min_items > static_cast<double>(prefix)) {
          const json& items = s.contains("items") ? s["items"] : s.contains("unevaluatedItems") ? s["unevaluatedItems"] : json(true);
          ok = ok && satisfiable(items);
        }
        if (ok) return true;
      } else {
        return true;
      }
    }
    return false;
  }

  const json& root_;
  SchemaUse use_;
  std::string where_;
  const ConstraintLimits& limits_;
  int64_t nodes_ = 0;
  std::set<std::string> walked_;        // JSON pointers ("#/...") of the subschemas checked
  std::set<std::string> pending_refs_;  // $ref targets to check
  std::map<std::string, bool> satisfiable_refs_;
  static constexpr int64_t kMaxSatisfiableSteps = 1'000'000;  // about 0.15 s on this 2-core VM
  int64_t satisfiable_steps_ = 0;
};

}  // namespace

Status check_json_schema(const json& schema, SchemaUse use, std::string_view where, const ConstraintLimits& limits) {
  return SchemaChecker(schema, use, where, limits).run();
}

}  // namespace cedar::constrain
