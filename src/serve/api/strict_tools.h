// `strict: true` function tools (Chat Completions and Responses), as deepseek-recipe 0.2.0 converts
// them: every strict tool's parameter schema is read as a typed JSON schema and written back in its
// canonical form, which is what the V4.1 prompt shows:
//
//   object   {"type", "properties", "additionalProperties": false, "required": [every property, in
//            property order], "description"}; a "required" list naming other than every property,
//            or additionalProperties other than false, is refused, and so is a nested object without
//            properties
//   string   {"type", "description", "pattern", "format" (email|hostname|ipv4|ipv6|uuid), "enum"}
//   integer, number
//            {"type", "description", "const", "default", "minimum", "maximum", "exclusiveMinimum",
//            "exclusiveMaximum", "multipleOf"}
//   boolean, null, or a list of those primitive types: {"type", "description"}
//   array    {"type", "items" (required), "description"}
//   anyOf    {"anyOf", "description"};  $ref  {"$ref"}
//
// Every other keyword is dropped; a schema with none of type / anyOf / $ref is refused. Missing
// parameters become an object with no properties. A request may not mix strict and non-strict
// tools. (Observed by converting requests with deepseek-recipe; tests/serve/recipe checks it.)
// Anthropic Messages ignore `strict`, as deepseek-recipe does.
#pragma once

#include <vector>

#include "serve/api/chat_types.h"
#include "serve/api/schema_util.h"

namespace cedar::serve {

// Rewrites the parameters of the strict tools among `tools` (function objects with "name",
// "parameters", "strict"); `path` names the tools field in errors ("tools").
SchemaError apply_strict_tools(std::vector<OrderedJson>* tools, const std::string& path);

}  // namespace cedar::serve
