#include "serve/api/output_constraint.h"

#include <set>

#include "constrain/constraint_limits.h"

namespace cedar::serve {
namespace {

// Walks every subschema that can hold an object and puts it in strict form.
SchemaError make_strict(OrderedJson& schema, const std::string& field) {
  if (!schema.is_object()) return std::nullopt;
  // A reference or a union is checked where its targets are defined ($defs) or listed (anyOf).
  if (!schema.contains("$ref") && !schema.contains("anyOf") && !schema.contains("type"))
    return invalid_request("'" + field + "': every subschema of a strict json_schema needs `type`, `anyOf` or `$ref`",
                           field);
  const bool is_object = schema.contains("type") && schema["type"] == "object";
  if (is_object) {
    if (!schema.contains("properties") || !schema["properties"].is_object() || schema["properties"].empty())
      return invalid_request("'" + field + "': a strict json_schema does not allow an object with no properties", field);
    if (schema.contains("additionalProperties") && schema["additionalProperties"] != false)
      return invalid_request("'" + field + "': a strict json_schema does not allow additionalProperties", field);
    std::set<std::string> names;
    OrderedJson all = OrderedJson::array();
    for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) {
      names.insert(it.key());
      all.push_back(it.key());
    }
    if (schema.contains("required")) {
      std::set<std::string> required;
      if (schema["required"].is_array())
        for (const OrderedJson& r : schema["required"])
          if (r.is_string()) required.insert(r.get<std::string>());
      if (required != names)
        return invalid_request("'" + field + "': a strict json_schema must list every property of an object in `required`",
                               field);
    }
    schema["additionalProperties"] = false;
    schema["required"] = std::move(all);
    for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it)
      CEDAR_SCHEMA_TRY(make_strict(it.value(), field));
  }
  if (schema.contains("items")) CEDAR_SCHEMA_TRY(make_strict(schema["items"], field));
  for (const char* list : {"anyOf", "prefixItems"})
    if (schema.contains(list) && schema[list].is_array())
      for (OrderedJson& option : schema[list]) CEDAR_SCHEMA_TRY(make_strict(option, field));
  for (const char* defs : {"$defs", "definitions"})
    if (schema.contains(defs) && schema[defs].is_object())
      for (auto it = schema[defs].begin(); it != schema[defs].end(); ++it) CEDAR_SCHEMA_TRY(make_strict(it.value(), field));
  return std::nullopt;
}

}  // namespace

SchemaError choose_named_tool(const std::string& name, const std::string& field, ChatRequest* request) {
  for (const OrderedJson& fn : request->tools) {
    if (fn.contains("name") && fn["name"] == name) {
      const OrderedJson chosen = fn;
      request->tools.assign(1, chosen);  // the prompt declares only the chosen tool, as deepseek-recipe
      request->tool_call_required = true;
      return std::nullopt;
    }
  }
  return invalid_request("'" + field + "' names the function '" + name + "', which 'tools' does not declare", field);
}

SchemaError require_tool_call(const std::string& field, ChatRequest* request) {
  if (request->tools.empty())
    return invalid_request("'" + field + "' requires a tool call, but the request declares no tools", field);
  request->tool_call_required = true;
  return std::nullopt;
}

SchemaError strict_json_schema(const OrderedJson& schema, const std::string& field, OrderedJson* out) {
  if (!schema.is_object() || !schema.contains("type") || schema["type"] != "object")
    return invalid_request("'" + field + "': the top level of a strict json_schema must be an object", field);
  *out = schema;
  return make_strict(*out, field);
}

std::optional<constrain::ConstraintSpec> output_constraint(const ChatRequest& request, bool thinking) {
  constrain::ConstraintSpec spec;
  spec.after_think_end = thinking;
  if (!request.tools.empty()) {
    OrderedJson tools = OrderedJson::array();
    for (const OrderedJson& fn : request.tools) {
      OrderedJson tool = {{"name", fn.value("name", "")}};
      if (fn.contains("parameters") && fn["parameters"].is_object()) tool["parameters"] = fn["parameters"];
      tools.push_back(std::move(tool));
    }
    spec.kind = request.tool_call_required ? constrain::ConstraintKind::kToolCallRequired
                                           : constrain::ConstraintKind::kToolCall;
    spec.text = tools.dump();
    return spec;
  }
  if (!request.answer_constraint) return std::nullopt;
  spec.kind = request.answer_constraint->regex ? constrain::ConstraintKind::kRegex : constrain::ConstraintKind::kJson;
  spec.text = request.answer_constraint->text;
  spec.strict = request.answer_constraint->strict;
  return spec;
}

SchemaError check_output_constraint(const ChatRequest& request) {
  const std::optional<constrain::ConstraintSpec> spec = output_constraint(request, /*thinking=*/false);
  if (!spec) return std::nullopt;
  const std::string field = request.tools.empty() && request.answer_constraint ? request.answer_constraint->field : "tools";
  const Status checked = constrain::check_constraint(*spec, field);
  if (!checked.ok()) return invalid_request(checked.message(), field);
  return std::nullopt;
}

}  // namespace cedar::serve
