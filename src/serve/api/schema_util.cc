#include "serve/api/schema_util.h"

#include "serve/api/json_body.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

namespace cedar::serve {

int json_nesting_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  scan_json_outside_strings(text, [&](char c) {
    if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    if (c == ']' || c == '}') --depth;
    return true;
  });
  return deepest;
}

SchemaError parse_body(std::string_view body, OrderedJson* out, const std::function<bool()>& cancelled) {
  if (body.empty()) return invalid_request("the request body is empty; send a JSON object");
  OrderedJson parsed;
  if (std::optional<JsonError> error = parse_json_bounded(body, JsonLimits{}, &parsed, "the request body", cancelled))
    return invalid_request(error->message);
  if (!parsed.is_object()) return invalid_request("the request body must be a JSON object");
  *out = std::move(parsed);
  return std::nullopt;
}

std::string to_wire(const OrderedJson& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::detail::error_handler_t::replace);
}

std::string field_path(const std::string& parent, size_t index) {
  return parent + "[" + std::to_string(index) + "]";
}

std::string field_path(const std::string& parent, const char* key) {
  return parent.empty() ? std::string(key) : parent + "." + key;
}

namespace {

const char* type_name(const OrderedJson& v) {
  switch (v.type()) {
    case OrderedJson::value_t::null: return "null";
    case OrderedJson::value_t::object: return "an object";
    case OrderedJson::value_t::array: return "an array";
    case OrderedJson::value_t::string: return "a string";
    case OrderedJson::value_t::boolean: return "a boolean";
    case OrderedJson::value_t::number_integer:
    case OrderedJson::value_t::number_unsigned:
    case OrderedJson::value_t::number_float: return "a number";
    default: return "an unsupported value";
  }
}

ApiError wrong_type(const std::string& path, const char* expected, const OrderedJson& got) {
  return invalid_request(std::string("'") + path + "' must be " + expected + " (got " + type_name(got) + ")", path);
}

}  // namespace

SchemaError read_string(const OrderedJson& obj, const char* key, const std::string& path, std::string* out,
                        bool required) {
  auto it = obj.find(key);
  const std::string p = field_path(path, key);
  if (it == obj.end() || (it->is_null() && !required)) {
    if (required) return invalid_request(std::string("'") + p + "' is required", p);
    return std::nullopt;
  }
  if (!it->is_string()) return wrong_type(p, "a string", *it);
  *out = it->get<std::string>();
  return std::nullopt;
}

SchemaError read_bool(const OrderedJson& obj, const char* key, const std::string& path, bool* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return wrong_type(field_path(path, key), "a boolean", *it);
  *out = it->get<bool>();
  return std::nullopt;
}

SchemaError read_int(const OrderedJson& obj, const char* key, const std::string& path, int64_t lo, int64_t hi,
                     std::optional<int64_t>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  const std::string p = field_path(path, key);
  // 3.0 is accepted as 3 (JSON has one number type; some clients serialise integers as floats).
  double as_double = 0;
  if (it->is_number_integer()) {
    as_double = it->is_number_unsigned() ? static_cast<double>(it->get<uint64_t>())
                                         : static_cast<double>(it->get<int64_t>());
  } else if (it->is_number_float() && std::isfinite(it->get<double>()) &&
             it->get<double>() == std::floor(it->get<double>())) {
    as_double = it->get<double>();
  } else {
    return wrong_type(p, "an integer", *it);
  }
  if (as_double < static_cast<double>(lo) || as_double > static_cast<double>(hi))
    return invalid_request(
        std::string("'") + p + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi), p);
  *out = static_cast<int64_t>(as_double);
  return std::nullopt;
}

SchemaError read_number(const OrderedJson& obj, const char* key, const std::string& path, double lo, double hi,
                        std::optional<double>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  const std::string p = field_path(path, key);
  if (!it->is_number()) return wrong_type(p, "a number", *it);
  const double x = it->get<double>();
  if (!(x >= lo && x <= hi)) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "' must be between %g and %g", lo, hi);
    return invalid_request(std::string("'") + p + buf, p);
  }
  *out = x;
  return std::nullopt;
}

namespace {

// The `type` of the content part `part` at `p` (an object with a string `type`).
SchemaError read_part_type(const OrderedJson& part, const std::string& p, std::string* type) {
  if (!part.is_object()) return wrong_type(p, "an object", part);
  return read_string(part, "type", p, type, /*required=*/true);
}

}  // namespace

SchemaError read_text_content(const OrderedJson& content, const std::string& path,
                              const std::vector<std::string_view>& text_types, std::string* out) {
  out->clear();
  if (content.is_null()) return std::nullopt;
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return wrong_type(path, "a string or an array of content parts", content);
  for (size_t i = 0; i < content.size(); ++i) {
    const OrderedJson& part = content[i];
    const std::string p = field_path(path, i);
    std::string type;
    CEDAR_SCHEMA_TRY(read_part_type(part, p, &type));
    bool is_text = false;
    for (std::string_view t : text_types) is_text |= (type == t);
    if (!is_text)
      return invalid_request(std::string("'") + field_path(p, "type") + "' is \"" + type +
                                 "\": only text parts are accepted here (images are taken in user messages only)",
                             field_path(p, "type"));
    std::string text;
    CEDAR_SCHEMA_TRY(read_string(part, "text", p, &text, /*required=*/true));
    if (i > 0) *out += "\n\n";  // how the V4.1 encoder joins text blocks
    *out += text;
  }
  return std::nullopt;
}

SchemaError read_image_part(const OrderedJson& part, const std::string& type, const std::string& path,
                            std::string* url) {
  const auto remote = [&](const std::string& p) {
    return invalid_request("'" + p + "': this server does not fetch images from URLs or files; send the image "
                               "inline, base64-encoded (a data:image/png;base64,... URL, or an Anthropic base64 source)",
                           p);
  };
  if (type == "image") {  // Anthropic
    const std::string spath = field_path(path, "source");
    auto source = part.find("source");
    if (source == part.end() || !source->is_object())
      return invalid_request("'" + spath + "' must be an object {\"type\": \"base64\", \"media_type\", \"data\"}", spath);
    std::string kind, media, data;
    CEDAR_SCHEMA_TRY(read_string(*source, "type", spath, &kind, /*required=*/true));
    if (kind != "base64") return remote(field_path(spath, "type"));
    CEDAR_SCHEMA_TRY(read_string(*source, "media_type", spath, &media));
    CEDAR_SCHEMA_TRY(read_string(*source, "data", spath, &data, /*required=*/true));
    *url = "data:" + media + ";base64," + data;
    return std::nullopt;
  }
  const std::string upath = field_path(path, "image_url");
  auto iu = part.find("image_url");
  if (iu != part.end() && iu->is_object()) {
    CEDAR_SCHEMA_TRY(read_string(*iu, "url", upath, url, /*required=*/true));
  } else if (iu != part.end() && iu->is_string()) {
    *url = iu->get<std::string>();
  } else if (part.contains("file_id")) {
    return remote(field_path(path, "file_id"));
  } else {
    return invalid_request("'" + upath + "' is missing: an image part needs its image as a base64 data URL", upath);
  }
  if (!url->starts_with("data:")) return remote(upath);
  return std::nullopt;
}

SchemaError read_user_content(const OrderedJson& content, const std::string& path,
                              const std::vector<std::string_view>& text_types,
                              const std::vector<std::string_view>& image_types, Message* out) {
  out->content.clear();
  out->content_blocks = nullptr;
  if (!content.is_array()) return read_text_content(content, path, text_types, &out->content);
  OrderedJson blocks = OrderedJson::array();
  bool any_image = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const OrderedJson& part = content[i];
    const std::string p = field_path(path, i);
    std::string type;
    CEDAR_SCHEMA_TRY(read_part_type(part, p, &type));
    bool is_image = false;
    for (std::string_view t : image_types) is_image |= (type == t);
    if (is_image) {
      std::string url;
      CEDAR_SCHEMA_TRY(read_image_part(part, type, p, &url));
      blocks.push_back({{"type", "image_url"}, {"image_url", {{"url", std::move(url)}}}});
      any_image = true;
      continue;
    }
    bool is_text = false;
    for (std::string_view t : text_types) is_text |= (type == t);
    if (!is_text)
      return invalid_request(std::string("'") + field_path(p, "type") + "' is \"" + type +
                                 "\": only text and image parts are accepted here",
                             field_path(p, "type"));
    std::string text;
    CEDAR_SCHEMA_TRY(read_string(part, "text", p, &text, /*required=*/true));
    if (i > 0) out->content += "\n\n";
    out->content += text;
    blocks.push_back({{"type", "text"}, {"text", std::move(text)}});
  }
  if (any_image) out->content_blocks = std::move(blocks);
  return std::nullopt;
}

SchemaError read_stop(const OrderedJson& value, const std::string& path, size_t max_count,
                      std::vector<std::string>* out) {
  out->clear();
  if (value.is_null()) return std::nullopt;
  if (value.is_string()) {
    if (!value.get<std::string>().empty()) out->push_back(value.get<std::string>());
    return std::nullopt;
  }
  if (!value.is_array()) return wrong_type(path, "a string or an array of strings", value);
  if (value.size() > max_count)
    return invalid_request(
        std::string("'") + path + "' may hold at most " + std::to_string(max_count) + " strings", path);
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_string()) return wrong_type(field_path(path, i), "a string", value[i]);
    if (value[i].get<std::string>().empty())
      return invalid_request(std::string("'") + field_path(path, i) + "' is empty", field_path(path, i));
    out->push_back(value[i].get<std::string>());
  }
  return std::nullopt;
}

SchemaError read_effort(const OrderedJson& value, const std::string& path, ReasoningOptions* reasoning) {
  if (value.is_null()) return std::nullopt;
  if (value.is_string()) {
    const std::string word = value.get<std::string>();
    if (word == "none") {
      reasoning->thinking = false;
      return std::nullopt;
    }
    if (auto effort = effort_from_word(word)) {
      reasoning->thinking = true;
      reasoning->effort = *effort;
      return std::nullopt;
    }
  } else if (value.is_number_integer() && value.get<int64_t>() >= 1 && value.get<int64_t>() <= 100) {
    reasoning->thinking = true;
    reasoning->effort = value.get<int>();
    return std::nullopt;
  }
  return invalid_request(std::string("'") + path +
                             "' must be one of none, minimal, low, medium, high, xhigh, max, or an integer "
                             "1..100 (V4.1's own scale)",
                         path);
}

SchemaError read_effort_text(const std::string& text, ReasoningOptions* reasoning) {
  const bool digits = !text.empty() && text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos;
  return read_effort(digits ? OrderedJson(std::stoi(text)) : OrderedJson(text), "effort", reasoning);
}

SchemaError check_history_arguments(const std::string& arguments, const std::string& path) {
  if (json_nesting_depth(arguments) > kMaxJsonDepth)
    return invalid_request(
        std::string("'") + path + "' nests deeper than " + std::to_string(kMaxJsonDepth) + " levels", path);
  // Arguments that are JSON are parsed again when the prompt is rendered; the body's limits (keys per
  // object, values, memory) apply to them too, so that second parse stays bounded. Text that is not
  // JSON is accepted as is.
  OrderedJson parsed;
  const std::string what = "'" + path + "'";
  if (std::optional<JsonError> error = parse_json_bounded(arguments, JsonLimits{}, &parsed, what);
      error && error->kind != JsonError::Kind::kSyntax)
    return invalid_request(error->message, path);
  return std::nullopt;
}

std::string random_id(std::string_view prefix) {
  static constexpr char kAlphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id(prefix);
  std::uniform_int_distribution<int> pick(0, sizeof(kAlphabet) - 2);
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(rng)];
  return id;
}

int64_t unix_seconds_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace cedar::serve
