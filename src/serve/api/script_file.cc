#include "serve/api/script_file.h"

#include <nlohmann/json.hpp>

#include "io/mapped_file.h"

namespace cedar::serve {
namespace {

using nlohmann::json;

Status field_error(const std::string& source, const std::string& field, const std::string& what) {
  return invalid_argument(source + ": field \"" + field + "\" " + what);
}

Result<int64_t> optional_int(const json& obj, const char* key, int64_t fallback, int64_t lo, int64_t hi,
                             const std::string& source) {
  if (!obj.contains(key)) return fallback;
  const json& v = obj[key];
  if (!v.is_number_integer()) return field_error(source, key, "must be an integer");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    return field_error(source, key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

Result<ScriptedReply> parse_reply(const json& r, size_t index, const tokenizer::Tokenizer& tok,
                                  const std::string& source) {
  const std::string where = "replies[" + std::to_string(index) + "]";
  if (!r.is_object()) return field_error(source, where, "must be an object");
  ScriptedReply reply;
  if (r.contains("when_prompt_contains")) {
    if (!r["when_prompt_contains"].is_string())
      return field_error(source, where + ".when_prompt_contains", "must be a string");
    reply.when_prompt_contains = r["when_prompt_contains"].get<std::string>();
  }
  const bool has_text = r.contains("completion"), has_ids = r.contains("completion_ids");
  if (has_text == has_ids) return field_error(source, where, "needs exactly one of completion / completion_ids");
  if (has_text) {
    if (!r["completion"].is_string()) return field_error(source, where + ".completion", "must be a string");
    auto ids = tok.encode(r["completion"].get<std::string>(), /*add_special=*/false);
    if (!ids.ok()) return field_error(source, where + ".completion", "cannot be encoded: " + ids.status().message());
    reply.output_ids = std::move(*ids);
  } else {
    const json& ids = r["completion_ids"];
    if (!ids.is_array()) return field_error(source, where + ".completion_ids", "must be an array of token ids");
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= tok.vocab_size())
        return field_error(source, where + ".completion_ids",
                           "must hold token ids in [0, " + std::to_string(tok.vocab_size()) + ")");
      reply.output_ids.push_back(id.get<int32_t>());
    }
  }
  if (reply.output_ids.empty()) return field_error(source, where, "has an empty completion");
  return reply;
}

}  // namespace

Result<ScriptFile> parse_script(std::string_view json_text, const tokenizer::Tokenizer& tok,
                                const std::string& source) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid_argument(source + ": not valid JSON");
  if (!root.is_object()) return invalid_argument(source + ": the top level must be a JSON object");
  ScriptFile script;
  CEDAR_ASSIGN_OR_RETURN(int64_t delay_ms, optional_int(root, "token_delay_ms", 0, 0, 60'000, source));
  CEDAR_ASSIGN_OR_RETURN(int64_t prefill_us, optional_int(root, "prefill_delay_us_per_token", 0, 0, 1'000'000, source));
  CEDAR_ASSIGN_OR_RETURN(int64_t max_active, optional_int(root, "max_active", 0, 0, 1'000'000, source));
  script.options.token_delay = std::chrono::milliseconds(delay_ms);
  script.options.prefill_delay_per_token = std::chrono::microseconds(prefill_us);
  script.options.max_active = static_cast<int>(max_active);
  if (!root.contains("replies") || !root["replies"].is_array() || root["replies"].empty())
    return field_error(source, "replies", "must be a non-empty array");
  for (size_t i = 0; i < root["replies"].size(); ++i) {
    CEDAR_ASSIGN_OR_RETURN(ScriptedReply reply, parse_reply(root["replies"][i], i, tok, source));
    script.replies.push_back(std::move(reply));
  }
  return script;
}

Result<ScriptFile> load_script(const std::string& path, const tokenizer::Tokenizer& tok) {
  CEDAR_ASSIGN_OR_RETURN(io::MappedFile file, io::MappedFile::open(path));
  const std::string_view text(reinterpret_cast<const char*>(file.data()), file.size());
  return parse_script(text, tok, path);
}

}  // namespace cedar::serve
