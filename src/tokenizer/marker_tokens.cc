#include "tokenizer/marker_tokens.h"

#include <algorithm>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

namespace cedar::tokenizer {
namespace {

using json = nlohmann::json;

constexpr std::string_view kPlaceholderPrefix = "<｜place▁holder▁no▁";
// The image token: V4.1's config (image_token_id) and deepseek-recipe (IMAGE_SPECIAL_TOKEN_ID) put
// it at 129264, which the V4-series tokenizer.json names as below.
constexpr int64_t kImageTokenId = 129264;
constexpr std::string_view kV4ImageName = "<｜image2｜>";

// V4.1's ids for markers whose id V3 also has as a placeholder.
const std::map<std::string_view, int64_t>& preferred_ids() {
  static const std::map<std::string_view, int64_t> ids = {{kSystemMarker, 128799}};
  return ids;
}

}  // namespace

std::vector<std::string_view> v41_marker_tokens() {
  return {kBos, kEos, kSystemMarker, kUserMarker, kAssistantMarker, kThinkStart, kThinkEnd, kDsml,
          kLatestReminderMarker};
}

Result<std::string> add_v41_markers(std::string_view tokenizer_json, std::vector<std::string>* added) {
  // Parsed only to read; the edit is made on the text, so everything else (key order, spacing)
  // stays byte for byte.
  json t;
  try {
    t = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    return invalid_argument(std::string("tokenizer.json is not valid JSON: ") + e.what());
  }
  if (!t.is_object() || !t.contains("added_tokens") || !t["added_tokens"].is_array() || !t.contains("model") ||
      !t["model"].is_object() || !t["model"].contains("vocab") || !t["model"]["vocab"].is_object())
    return invalid_argument("tokenizer.json needs an 'added_tokens' array and a 'model.vocab' object");
  const json& tokens = t["added_tokens"];
  const json& vocab = t["model"]["vocab"];

  std::set<std::string> contents;
  std::map<int64_t, std::string> placeholders;  // id -> content
  for (size_t i = 0; i < tokens.size(); ++i) {
    const json& a = tokens[i];
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string())
      return invalid_argument("tokenizer.json: added_tokens[" + std::to_string(i) +
                              "] needs an integer 'id' and a string 'content'");
    const std::string content = a["content"].get<std::string>();
    contents.insert(content);
    if (content.rfind(kPlaceholderPrefix, 0) == 0 && a.value("special", false))
      placeholders[a["id"].get<int64_t>()] = content;
  }

  std::string out(tokenizer_json);
  for (std::string_view marker : v41_marker_tokens()) {
    if (contents.count(std::string(marker)) || vocab.contains(std::string(marker))) continue;
    if (placeholders.empty())
      return failed_precondition("tokenizer.json has no single token for '" + std::string(marker) +
                                 "' and no unused placeholder token to give it: use a DeepSeek-V4.1 tokenizer.json");
    auto it = placeholders.end();
    if (auto p = preferred_ids().find(marker); p != preferred_ids().end()) it = placeholders.find(p->second);
    if (it == placeholders.end()) it = std::prev(placeholders.end());
    // The placeholder's name occurs once in the file (as its added token's content); it is
    // renamed there.
    const std::string from = json(it->second).dump(), to = json(std::string(marker)).dump();
    const size_t at = out.find(from);
    if (at == std::string::npos || out.find(from, at + 1) != std::string::npos)
      return failed_precondition("tokenizer.json: placeholder " + it->second +
                                 " does not occur exactly once; cannot rename it to " + std::string(marker));
    out.replace(at, from.size(), to);
    if (added) added->push_back(std::string(marker) + "=" + std::to_string(it->first));
    placeholders.erase(it);
  }
  // V4-series files name V4.1's image token (id 129264) <｜image2｜>; V4.1 spells it as its encoder
  // writes the placeholder.
  if (!contents.count(std::string(kImagePlaceholder))) {
    for (const json& a : tokens) {
      if (a["id"].get<int64_t>() != kImageTokenId || a["content"] != kV4ImageName) continue;
      const std::string from = json(std::string(kV4ImageName)).dump(), to = json(std::string(kImagePlaceholder)).dump();
      const size_t at = out.find(from);
      if (at == std::string::npos || out.find(from, at + 1) != std::string::npos)
        return failed_precondition("tokenizer.json: " + std::string(kV4ImageName) +
                                   " does not occur exactly once; cannot rename it to " + std::string(kImagePlaceholder));
      out.replace(at, from.size(), to);
      if (added) added->push_back(std::string(kImagePlaceholder) + "=" + std::to_string(kImageTokenId));
    }
  }
  return out;
}

}  // namespace cedar::tokenizer
