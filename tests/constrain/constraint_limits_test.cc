// Limits and JSON Schema keywords of output constraints (constrain/constraint_limits.h): every
// hostile constraint of issue 35 is refused before compilation with a message naming the limit or
// keyword and where it is; ordinary agent schemas and regexes pass. The expected limits are the
// documented defaults (docs/SERVER.md, "Constraint limits").
#include "constrain/constraint_limits.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace cedar::constrain {
namespace {

ConstraintSpec spec_of(ConstraintKind kind, std::string text) {
  ConstraintSpec spec;
  spec.kind = kind;
  spec.text = std::move(text);
  return spec;
}

// The message of a refused constraint ("" when it passes).
std::string refusal(ConstraintKind kind, const std::string& text, std::string_view field = "f") {
  const Status s = check_constraint(spec_of(kind, text), field);
  if (s.ok()) return "";
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  return s.message();
}
std::string regex_refusal(const std::string& re) { return refusal(ConstraintKind::kRegex, re, "response_format.regex"); }
std::string schema_refusal(const std::string& schema) { return refusal(ConstraintKind::kJson, schema, "text.format.schema"); }
std::string tool_refusal(const std::string& parameters) {
  return refusal(ConstraintKind::kToolCall, R"([{"name": "t", "parameters": )" + parameters + "}]", "tools");
}

TEST(ConstraintLimits, RepetitionBoundsAreRefusedWithTheValueAndTheLimit) {
  EXPECT_EQ(regex_refusal("a{99999999999}"),
            "regex repetition bound 99999999999 exceeds the limit of 1000 (response_format.regex)");
  EXPECT_NE(regex_refusal("a{10000000}").find("bound 10000000 exceeds the limit of 1000"), std::string::npos);
  EXPECT_NE(regex_refusal("a{2,5000}").find("bound 5000"), std::string::npos);
  EXPECT_NE(regex_refusal("a{5000,}").find("bound 5000"), std::string::npos);
  EXPECT_NE(regex_refusal("(a|b){1,99999999999999999999999999999}").find("exceeds the limit of 1000"), std::string::npos);
  EXPECT_EQ(regex_refusal("x{1000}"), "");  // at the limit
}

TEST(ConstraintLimits, NestedRepetitionsAreBoundedByTheirProduct) {
  EXPECT_EQ(regex_refusal("(a{1000}){1000}"),
            "regex nested repetition product 1000000 exceeds the limit of 10000 (response_format.regex)");
  EXPECT_NE(regex_refusal("((a{20}){20}){30}").find("product 12000"), std::string::npos);
  EXPECT_NE(regex_refusal("(?:(?<x>[a-z]{50})+){300}").find("product 15000"), std::string::npos);
  EXPECT_EQ(regex_refusal("(a{100}){100}"), "");
  // Many repetitions side by side: the unrolled size is bounded too.
  std::string wide;
  for (int i = 0; i < 101; ++i) wide += "a{1000}";
  EXPECT_NE(regex_refusal(wide).find("regex size with its repetitions unrolled"), std::string::npos);
}

TEST(ConstraintLimits, CountedRepetitionsOfAmbiguousPartsAreBounded) {
  // Measured on the 2-core VM (V4 tokenizer, per token of English text): 240 ms, 2.6 s, 54 ms, 39 ms.
  EXPECT_EQ(regex_refusal("([a-z ]{0,10}){0,10}"),
            "regex product of counted repetitions over a variable-length part 100 exceeds the limit of 8: the copies "
            "can split the text in many ways, each costly to follow; delimit the part by a character it cannot hold, "
            "as in ( [a-z]{1,6}){0,5} (response_format.regex)");
  EXPECT_NE(regex_refusal("(.{0,7}){0,7}").find("variable-length part 49"), std::string::npos);
  EXPECT_NE(regex_refusal("([a-z ]{0,5}){0,5}").find("variable-length part 25"), std::string::npos);
  EXPECT_NE(regex_refusal("(.{0,3}){0,3}").find("variable-length part 9"), std::string::npos);
  EXPECT_NE(regex_refusal("((.{0,2}){0,2}){0,3}").find("variable-length part 12"), std::string::npos);
  EXPECT_NE(regex_refusal("( [a-z ]{1,6}){0,5}").find("variable-length part 30"), std::string::npos)
      << "the space delimits nothing: the part can hold one";
  EXPECT_NE(regex_refusal("(ab|a){20}").find("variable-length part 20"), std::string::npos);
  // Delimited parts split one way only; fixed-length parts and single levels are not ambiguous.
  for (const char* re : {"(.{0,2}){0,2}", "( [a-z]{1,6}){0,8}", R"((\d{1,3}\.){3}\d{1,3})", "(a|b| ){0,30}",
                         "(a{100}){100}", "[a-z ]{0,1000}", "([a-z]{1,10},){1,100}", R"((yes|no|maybe): [a-z]{1,6}( [a-z]{1,6}){0,2} [0-9]{1,3}\.)"})
    EXPECT_EQ(regex_refusal(re), "") << re;
}

TEST(ConstraintLimits, BracesInEscapesAndClassesAreNotCounts) {
  EXPECT_EQ(regex_refusal(R"(\{99999999\})"), "");
  EXPECT_EQ(regex_refusal(R"([{]99999999})"), "");
  EXPECT_EQ(regex_refusal(R"([a{99999999}])"), "");
  EXPECT_EQ(regex_refusal(R"([\]{99999999}])"), "") << "`{99999999}` inside the class, after an escaped ]";
  EXPECT_NE(regex_refusal(R"([\]]{99999999})").find("bound 99999999"), std::string::npos) << "the class ends at the second ]";
  EXPECT_EQ(regex_refusal(R"(\u{1F600}{3})"), "");
  EXPECT_EQ(regex_refusal("x{,5}"), "") << "not a count in xgrammar's syntax: a literal (xgrammar reports it)";
  EXPECT_NE(regex_refusal(R"(\\{99999})").find("bound 99999"), std::string::npos) << "an escaped backslash, then a count";
}

TEST(ConstraintLimits, EverydayRegexesPass) {
  for (const char* re : {R"(\d{4}-\d{2}-\d{2})", "[A-Z][a-z]{2,15}( [A-Z][a-z]{2,15}){0,3}", R"(^\+?[0-9 ()-]{7,20}$)",
                         "(yes|no|maybe)", R"([a-zA-Z0-9._%+-]{1,64}@[a-zA-Z0-9.-]{1,253}\.[a-zA-Z]{2,24})", "é{3}ü+",
                         "(a(b(c(d)?)*)+){0,5}"})
    EXPECT_EQ(regex_refusal(re), "") << re;
}

TEST(ConstraintLimits, GroupDepthAndLengthAndTotalSize) {
  EXPECT_NE(regex_refusal(std::string(40, '(') + "a" + std::string(40, ')')).find("regex group nesting depth 33 exceeds the limit of 32"),
            std::string::npos);
  EXPECT_NE(regex_refusal(std::string(17 * 1024, 'a')).find("regex length 17408 bytes exceeds the limit of 16384"),
            std::string::npos);
  const std::string big = "{\"type\": \"string\", \"description\": \"" + std::string(600 * 1024, 'x') + "\"}";
  EXPECT_NE(schema_refusal(big).find("constraint size"), std::string::npos);
  EXPECT_NE(schema_refusal(big).find("exceeds the limit of 524288 (text.format.schema)"), std::string::npos);
}

TEST(ConstraintLimits, SchemaPatternsAreCheckedWhereverXgrammarReadsARegex) {
  EXPECT_EQ(schema_refusal(R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "a{99999999999}"}}})"),
            "regex repetition bound 99999999999 exceeds the limit of 1000 (text.format.schema, at #/properties/a/pattern)");
  EXPECT_NE(schema_refusal(R"({"type": "object", "patternProperties": {"^(x{1000}){1000}$": {"type": "integer"}}})")
                .find("nested repetition product 1000000"),
            std::string::npos);
  EXPECT_NE(schema_refusal(R"({"type": "object", "propertyNames": {"pattern": "k{5000}"}})").find("#/propertyNames/pattern"),
            std::string::npos);
  EXPECT_NE(tool_refusal(R"({"type": "object", "properties": {"q": {"type": "string", "pattern": "a{99999999999}"}}})")
                .find("(tools[0] 't' parameters, at #/properties/q/pattern)"),
            std::string::npos);
}

TEST(ConstraintLimits, SchemaSizesAreBounded) {
  EXPECT_NE(schema_refusal(R"({"type": "string", "maxLength": 99999999})").find("'maxLength' 99999999 exceeds the limit of 10000"),
            std::string::npos);
  EXPECT_NE(schema_refusal(R"({"type": "array", "minItems": 5000})").find("'minItems' 5000 exceeds the limit of 1000"),
            std::string::npos);
  EXPECT_NE(schema_refusal(R"({"type": "object", "maxProperties": 100000})").find("'maxProperties'"), std::string::npos);
  nlohmann::json many_values = nlohmann::json::array();
  for (int i = 0; i < 1001; ++i) many_values.push_back(i);
  EXPECT_NE(schema_refusal(nlohmann::json{{"enum", many_values}}.dump()).find("'enum' has 1001 values, more than the limit of 1000"),
            std::string::npos);
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < 40; ++i) deep = std::string(R"({"type": "array", "items": )").append(deep).append("}");
  EXPECT_NE(schema_refusal(deep).find("schema nesting depth 33 exceeds the limit of 32"), std::string::npos);
  nlohmann::json wide = {{"type", "object"}, {"properties", nlohmann::json::object()}};
  for (int i = 0; i < 501; ++i) wide["properties"]["p" + std::to_string(i)] = {{"type", "integer"}};
  EXPECT_NE(schema_refusal(wide.dump()).find("'properties' has 501 entries, more than the limit of 500"), std::string::npos);
  // Many objects of allowed size: the subschemas of the whole schema are bounded too.
  nlohmann::json many = {{"type", "object"}, {"properties", nlohmann::json::object()}};
  for (int k = 0; k < 21; ++k) {
    nlohmann::json part = {{"type", "object"}, {"properties", nlohmann::json::object()}};
    for (int i = 0; i < 480; ++i) part["properties"]["p" + std::to_string(i)] = {{"type", "integer"}};
    many["properties"]["o" + std::to_string(k)] = part;
  }
  EXPECT_NE(schema_refusal(many.dump()).find("more than 10000 subschemas"), std::string::npos);
}

TEST(ConstraintLimits, UnenforcedKeywordsAreRefusedByNameAndPath) {
  struct Case {
    const char* schema;
    const char* keyword;
    const char* path;
  };
  const Case cases[] = {
      {R"({"type": "object", "properties": {"a": {"not": {"type": "string"}}}})", "'not'", "#/properties/a"},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "if": {"required": ["a"]}, "then": {"required": ["b"]}})", "'if'", "at #)"},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "dependentRequired": {"a": ["b"]}})", "'dependentRequired'", "at #)"},
      {R"({"type": "array", "contains": {"type": "integer"}})", "'contains'", "at #)"},
      {R"({"type": "array", "items": {"type": "integer"}, "uniqueItems": true})", "'uniqueItems'", "at #)"},
      {R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"required": ["a"]}]})", "'allOf'", "at #)"},
      {R"({"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "object", "properties": {"b": {"type": "integer"}}}]})", "'oneOf'", "at #)"},
      {R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "'oneOf'", "at #)"},
      {R"({"type": "number", "multipleOf": 0.5})", "'multipleOf'", "at #)"},
      {R"({"type": "integer", "minimum": 0, "multipleOf": 5})", "'multipleOf'", "at #)"},
      {R"({"$defs": {"s": {"type": "string"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/s", "maxLength": 3}}})", "'maxLength'", "#/properties/a"},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "anyOf": [{"required": ["a"]}]})", "'properties'", "at #)"},
      {R"({"type": "string", "format": "idn-email"})", "'format'", "at #)"},
      {R"({"type": "string", "format": "date", "maxLength": 10})", "'maxLength'", "at #)"},
      {R"({"minLength": 3})", "'minLength'", "at #)"},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]})", "'required'", "at #)"},
  };
  for (const Case& c : cases) {
    const std::string m = schema_refusal(c.schema);
    EXPECT_NE(m.find(std::string("JSON Schema keyword ") + c.keyword + " is not enforced"), std::string::npos) << c.schema << "\n" << m;
    EXPECT_NE(m.find(c.path), std::string::npos) << c.schema << "\n" << m;
  }
  // Tool parameters: the DSML grammar enforces string lengths (GrammarEngine.DsmlToolStringLengths), so
  // agents' schemas with them pass (Claude Code's TodoWrite: "minLength": 1), their bound checked; beside
  // a pattern or a format lengths are dropped there too, and refused.
  EXPECT_EQ(tool_refusal(R"({"type": "object", "properties": {"todos": {"type": "array", "items": {"type": "object",
      "properties": {"content": {"type": "string", "minLength": 1}, "s": {"type": "string", "maxLength": 5}},
      "required": ["content"], "additionalProperties": false}}}, "$schema": "http://json-schema.org/draft-07/schema#"})"), "");
  EXPECT_NE(tool_refusal(R"({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$", "maxLength": 5}}})")
                .find("JSON Schema keyword 'maxLength' is not enforced"),
            std::string::npos);
  EXPECT_NE(tool_refusal(R"({"type": "object", "properties": {"d": {"type": "string", "format": "date", "minLength": 1}}})")
                .find("JSON Schema keyword 'minLength' is not enforced"),
            std::string::npos);
  EXPECT_NE(tool_refusal(R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 99999}}})").find("'maxLength' 99999"),
            std::string::npos);
  EXPECT_NE(schema_refusal(R"({"type": "string", "pattern": "^a+$", "maxLength": 5})").find("'maxLength'"), std::string::npos);
  EXPECT_NE(tool_refusal(R"({"type": "object", "properties": {"a": {"not": {}}}})").find("'not'"), std::string::npos);
}

TEST(ConstraintLimits, SchemasThatAcceptNothingAreRefused) {
  for (const char* schema : {R"({"anyOf": [{"$ref": "#"}]})", R"({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]})",
                             R"({"$defs": {"l": {"$ref": "#/$defs/m"}, "m": {"anyOf": [{"$ref": "#/$defs/l"}]}}, "$ref": "#/$defs/l"})",
                             R"({"type": "array", "minItems": 1, "items": false})"}) {
    EXPECT_NE(schema_refusal(schema).find("the schema accepts no value"), std::string::npos) << schema;
  }
  EXPECT_NE(schema_refusal(R"({"enum": []})").find("'enum' is empty, so the schema accepts no value"), std::string::npos);
  EXPECT_NE(schema_refusal("false").find("the schema `false` accepts no value"), std::string::npos);
  EXPECT_NE(schema_refusal(R"({"type": []})").find("'type' is an empty array"), std::string::npos);
  EXPECT_NE(schema_refusal(R"({"anyOf": []})").find("'anyOf' is empty"), std::string::npos);
  EXPECT_NE(schema_refusal(R"({"type": "string", "enum": ["a", 1]})").find("the enum value 1 does not match 'type'"),
            std::string::npos);
}

TEST(ConstraintLimits, LongReferenceChainsAreCheckedInBoundedWork) {
  // d0000 -> d0001 -> ... -> d2999 -> an integer: each round of the fixed point (in name order)
  // finds only the next link satisfiable, the worst order. The check finishes either way.
  nlohmann::json defs = nlohmann::json::object();
  char name[16];
  for (int k = 0; k < 3000; ++k) {
    std::snprintf(name, sizeof name, "d%04d", k);
    char next[32];
    std::snprintf(next, sizeof next, "#/$defs/d%04d", k + 1);
    defs[name] = k + 1 < 3000 ? nlohmann::json{{"anyOf", {{{"$ref", next}}}}} : nlohmann::json{{"type", "integer"}};
  }
  const nlohmann::json schema = {{"$defs", defs}, {"$ref", "#/$defs/d0000"}};
  const std::string m = schema_refusal(schema.dump());
  EXPECT_TRUE(m.empty() || m.find("$ref graph needs more than") != std::string::npos) << m;
  // The same chain without its base case accepts nothing.
  nlohmann::json loop = schema;
  loop["$defs"]["d2999"] = {{"anyOf", {{{"$ref", "#/$defs/d0000"}}}}};
  const std::string l = schema_refusal(loop.dump());
  EXPECT_TRUE(l.find("accepts no value") != std::string::npos || l.find("$ref graph") != std::string::npos) << l;
}

TEST(ConstraintLimits, AgentSchemasPass) {
  const char* schemas[] = {
      // Annotations, optional (pydantic's anyOf with null), $defs and a recursive tree with a base case.
      R"({"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "title": "T", "description": "d",
          "$comment": "c", "type": "object", "examples": [{}], "default": {},
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 200, "description": "n"},
                         "age": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 150}, {"type": "null"}], "default": null},
                         "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 20, "uniqueItems": false},
                         "when": {"type": "string", "format": "date-time"}, "id": {"type": "string", "format": "uuid"},
                         "kind": {"type": "string", "enum": ["a", "b"]}, "ui": {"type": "string", "format": "textarea"},
                         "tree": {"$ref": "#/$defs/node"}, "ratio": {"type": "number", "exclusiveMinimum": 0}},
          "required": ["name", "kind"], "additionalProperties": false,
          "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                              "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                             "required": ["v"]}}})",
      R"({"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
                    {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]}]})",
      R"({"oneOf": [{"type": "string"}, {"type": "integer"}, {"const": null}]})",
      R"({"allOf": [{"$ref": "#/definitions/a"}], "definitions": {"a": {"type": "object", "properties": {"q": {"type": "boolean"}}}}})",
      R"({"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100})",
      R"({"type": ["string", "null"], "pattern": "^[a-z]+$"})",
      R"({"type": "object", "properties": {"x": {"const": 3, "type": "integer"}}, "x-vendor": {"not": 1}, "nullable": true})",
      R"({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1})",
      "true",
      "{}",
  };
  for (const char* s : schemas) EXPECT_EQ(schema_refusal(s), "") << s;
  EXPECT_EQ(refusal(ConstraintKind::kJson, ""), "") << "json_object";
  EXPECT_EQ(tool_refusal(R"({"type": "object", "properties": {"path": {"type": "string", "description": "p"},
                           "limit": {"type": "integer", "minimum": 1}}, "required": ["path"]})"), "");
}

TEST(ConstraintLimits, GrammarErrorsLoseTheirPathsTimesAndTraces) {
  EXPECT_EQ(sanitize_grammar_error("[14:02:11] /work/main/third_party/xgrammar-0.2.9/cpp/regex_converter.cc:95: Regex parsing "
                                   "error at position 1: Unmatched ')'\nStack trace:\n  #0 0x1234 in f() at /x/y.cc:12\n"),
                   "Regex parsing error at position 1: Unmatched ')'");
  EXPECT_EQ(sanitize_grammar_error("[09:00:00] json_schema_converter.cc:5082: Schema 'false' cannot accept any value\n"),
            "Schema 'false' cannot accept any value");
  EXPECT_EQ(sanitize_grammar_error("Check failed: (x) is false: a.cc:not-a-line stays"), "Check failed: (x) is false: a.cc:not-a-line stays");
}

}  // namespace
}  // namespace cedar::constrain
