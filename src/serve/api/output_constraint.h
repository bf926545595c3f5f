// Constrained decoding, the request side: the tool_choice and response-format rules the three APIs
// share, and the output constraint a request gets, as deepseek-recipe 0.2.0 derives it
// (InferenceOptions.output_constraint):
//   tools declared, tool_choice auto          -> tool_call (free text, then optionally a DSML block
//                                                whose arguments follow the tools' schemas)
//   tools, tool_choice required / named       -> tool_call_required (non-thinking only; the prompt
//                                                ends with "<｜DSML｜ calls>\n")
//   no tools, response_format json_object     -> json, any JSON object or array (deepseek-recipe:
//                                                any JSON value, which its JSON output reading
//                                                would show as spaces unless it opens with { or [)
//   no tools, json_schema (strict or not)     -> json, the schema (strict: in strict form)
//   no tools, response_format regex           -> regex
// Thinking mode: the constraint starts after </think>; the reasoning is free text that cannot end the
// turn or, under the tool kinds, open a calls block (constrain/grammar_engine.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "constrain/grammar_engine.h"
#include "serve/api/chat_types.h"
#include "serve/api/schema_util.h"

namespace cedar::serve {

// tool_choice naming one function: keeps only that tool and marks the turn as a required call. 400
// when no declared tool has that name. `field` is the wire field for the error.
SchemaError choose_named_tool(const std::string& name, const std::string& field, ChatRequest* request);
// tool_choice "required" (Anthropic "any" is not: deepseek-recipe leaves it optional). 400 without tools.
SchemaError require_tool_call(const std::string& field, ChatRequest* request);

// A json_schema response format with strict: true, in the strict form deepseek-recipe enforces
// (OpenAI's structured-output rules): the top level is an object; every object declares its
// properties, lists them all in `required` (or leaves `required` out, which means all), and does not
// allow additional properties. The result has "additionalProperties": false and "required" set on
// every object. 400 naming the rule a schema breaks.
SchemaError strict_json_schema(const OrderedJson& schema, const std::string& field, OrderedJson* out);

// The constraint of `request` once its thinking mode is known; nullopt when none applies.
std::optional<constrain::ConstraintSpec> output_constraint(const ChatRequest& request, bool thinking);

// The limits and JSON Schema keywords of the request's constraint (constrain/constraint_limits.h),
// checked before the request is admitted or anything is compiled: a 400 that names the limit or
// keyword, where it is, and the request field.
SchemaError check_output_constraint(const ChatRequest& request);

}  // namespace cedar::serve
