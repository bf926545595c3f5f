#include "serve/api/strict_tools.h"

#include <algorithm>
#include <string_view>

namespace cedar::serve {
namespace {

// deepseek-recipe's words for a refused strict schema (its 400 messages).
SchemaError refuse(const std::string& what, const std::string& path) {
  return invalid_request("Invalid tool parameters schema at '" + path + "': " + what, path);
}

void copy_keys(const OrderedJson& from, std::initializer_list<const char*> keys, OrderedJson* to) {
  for (const char* k : keys)
    if (from.contains(k) && !from[k].is_null()) (*to)[k] = from[k];
}

bool is_primitive_type(const OrderedJson& t) {
  static constexpr std::string_view kTypes[] = {"string", "number", "integer", "boolean", "null"};
  return t.is_string() && std::find(std::begin(kTypes), std::end(kTypes), t.get<std::string>()) != std::end(kTypes);
}

SchemaError canonical(const OrderedJson& schema, const std::string& path, int depth, OrderedJson* out);

SchemaError canonical_object(const OrderedJson& schema, const std::string& path, int depth, OrderedJson* out) {
  OrderedJson properties = OrderedJson::object(), required = OrderedJson::array();
  if (schema.contains("properties") && !schema["properties"].is_null()) {
    const OrderedJson& props = schema["properties"];
    if (!props.is_object()) return refuse("'properties' must be an object", path);
    for (auto it = props.begin(); it != props.end(); ++it) {
      OrderedJson prop;
      CEDAR_SCHEMA_TRY(canonical(it.value(), field_path(field_path(path, "properties"), it.key().c_str()), depth + 1,
                                 &prop));
      properties[it.key()] = std::move(prop);
      required.push_back(it.key());
    }
  }
  if (depth > 0 && properties.empty()) return invalid_request("An object with no properties is not allowed.", path);
  if (schema.contains("additionalProperties") && !schema["additionalProperties"].is_null()) {
    const OrderedJson& extra = schema["additionalProperties"];
    if (!extra.is_boolean()) return refuse("'additionalProperties' must be a boolean", path);
    if (extra.get<bool>()) return invalid_request("additionalProperties should not be true", path);
  }
  if (schema.contains("required") && !schema["required"].is_null()) {
    const OrderedJson& listed = schema["required"];
    if (!listed.is_array()) return refuse("'required' must be an array", path);
    bool same = listed.size() == required.size();
    for (const OrderedJson& name : listed) same = same && properties.contains(name.is_string() ? name.get<std::string>() : "");
    if (!same) return invalid_request("Required properties must match all properties in the object", path);
  }
  (*out)["type"] = "object";
  (*out)["properties"] = std::move(properties);
  (*out)["additionalProperties"] = false;
  (*out)["required"] = std::move(required);
  copy_keys(schema, {"description"}, out);
  return std::nullopt;
}

SchemaError canonical(const OrderedJson& schema, const std::string& path, int depth, OrderedJson* out) {
  if (depth > kMaxJsonDepth) return refuse("nested too deeply", path);
  if (!schema.is_object()) return refuse("a schema must be an object", path);
  *out = OrderedJson::object();
  if (schema.contains("type") && !schema["type"].is_null()) {
    const OrderedJson& type = schema["type"];
    if (type.is_array()) {
      for (const OrderedJson& t : type)
        if (!is_primitive_type(t))
          return refuse("a list of types may hold only string, number, integer, boolean and null", path);
      (*out)["type"] = type;
      copy_keys(schema, {"description"}, out);
      return std::nullopt;
    }
    const std::string name = type.is_string() ? type.get<std::string>() : "";
    if (name == "object") return canonical_object(schema, path, depth, out);
    (*out)["type"] = name;
    if (name == "string") {
      if (schema.contains("format") && !schema["format"].is_null()) {
        static constexpr std::string_view kFormats[] = {"email", "hostname", "ipv4", "ipv6", "uuid"};
        const OrderedJson& f = schema["format"];
        if (!f.is_string() || std::find(std::begin(kFormats), std::end(kFormats), f.get<std::string>()) == std::end(kFormats))
          return refuse("'format' must be one of email, hostname, ipv4, ipv6, uuid", path);
      }
      copy_keys(schema, {"description", "pattern", "format", "enum"}, out);
    } else if (name == "integer" || name == "number") {
      copy_keys(schema, {"description", "const", "default", "minimum", "maximum", "exclusiveMinimum",
                         "exclusiveMaximum", "multipleOf"},
                out);
    } else if (name == "boolean" || name == "null") {
      copy_keys(schema, {"description"}, out);
    } else if (name == "array") {
      if (!schema.contains("items") || schema["items"].is_null()) return refuse("an array needs 'items'", path);
      OrderedJson items;
      CEDAR_SCHEMA_TRY(canonical(schema["items"], field_path(path, "items"), depth + 1, &items));
      (*out)["items"] = std::move(items);
      copy_keys(schema, {"description"}, out);
    } else {
      return refuse("unknown type " + type.dump(), path);
    }
    return std::nullopt;
  }
  if (schema.contains("anyOf") && !schema["anyOf"].is_null()) {
    const OrderedJson& any = schema["anyOf"];
    if (!any.is_array()) return refuse("'anyOf' must be an array", path);
    OrderedJson variants = OrderedJson::array();
    for (size_t i = 0; i < any.size(); ++i) {
      OrderedJson v;
      CEDAR_SCHEMA_TRY(canonical(any[i], field_path(field_path(path, "anyOf"), i), depth + 1, &v));
      variants.push_back(std::move(v));
    }
    (*out)["anyOf"] = std::move(variants);
    copy_keys(schema, {"description"}, out);
    return std::nullopt;
  }
  if (schema.contains("$ref") && schema["$ref"].is_string()) {
    (*out)["$ref"] = schema["$ref"];
    return std::nullopt;
  }
  return refuse("one of 'type', 'anyOf', '$ref' is required", path);
}

}  // namespace

SchemaError apply_strict_tools(std::vector<OrderedJson>* tools, const std::string& path) {
  size_t strict = 0;
  for (size_t i = 0; i < tools->size(); ++i) {
    OrderedJson& fn = (*tools)[i];
    const std::string tpath = field_path(path, i);
    auto flag = fn.find("strict");
    if (flag == fn.end() || flag->is_null()) continue;
    if (!flag->is_boolean()) {
      const std::string strict_path = field_path(tpath, "strict");
      return invalid_request("'" + strict_path + "' must be a boolean", strict_path);
    }
    if (!flag->get<bool>()) continue;
    ++strict;
    const std::string ppath = field_path(tpath, "parameters");
    const OrderedJson params = fn.contains("parameters") && !fn["parameters"].is_null()
                                   ? fn["parameters"]
                                   : OrderedJson{{"type", "object"}, {"properties", OrderedJson::object()}};
    if (!params.is_object() || !params.contains("type") || params["type"] != "object")
      return invalid_request("The top level of the function parameters schema must be an object.", ppath);
    OrderedJson rewritten;
    CEDAR_SCHEMA_TRY(canonical(params, ppath, 0, &rewritten));
    fn["parameters"] = std::move(rewritten);
  }
  if (strict > 0 && strict < tools->size())
    return invalid_request("Cannot use strict tool with non-strict tool in the same request", path);
  return std::nullopt;
}

}  // namespace cedar::serve
