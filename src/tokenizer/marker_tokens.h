// Gives a tokenizer.json the DeepSeek-V4.1 control markers as single tokens.
//
// Test checkpoints ship the repository's DeepSeek-V4-series vocabulary (the V4.1 file comes only with
// the released checkpoint), which lacks <｜System｜> (id 128799 is a placeholder there); the older
// DeepSeek-V3 vocabulary lacks five of V4.1's markers (<｜System｜>, <think>, </think>, ｜DSML｜,
// <｜latest_reminder｜>), so the V4.1 prompt encoder refuses every chat prompt with it. V3 does have
// unused added tokens named <｜place▁holder▁no▁N｜>: each missing marker takes over one of them,
// which keeps the id count, the byte-level vocabulary and the Engram class layout unchanged.
// <｜System｜> takes id 128799, its V4.1 id; the others take the highest remaining placeholders
// (V4.1's own ids for them, 128821 and up, lie beyond V3's last id 128814).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace cedar::tokenizer {

// The control markers of the V4.1 vocabulary, as the tokenizer spells them (the chat protocol of
// chat/ writes and parses them; each is one added token of a V4.1 tokenizer.json).
inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";
inline constexpr std::string_view kSystemMarker = "<｜System｜>";
inline constexpr std::string_view kUserMarker = "<｜User｜>";
inline constexpr std::string_view kAssistantMarker = "<｜Assistant｜>";
inline constexpr std::string_view kLatestReminderMarker = "<｜latest_reminder｜>";
inline constexpr std::string_view kImagePlaceholder = "<｜deepseek_image｜>";

// The markers the V4.1 prompt format needs as single tokens (the encoder checks them).
std::vector<std::string_view> v41_marker_tokens();

// Returns `tokenizer_json` with every V4.1 marker that is not yet a token renamed onto a
// placeholder, and the V4-series name of the image token (id 129264, <｜image2｜>) renamed to
// V4.1's <｜deepseek_image｜>; *added (optional) receives "marker=id" for each. A file that already has them all
// comes back unchanged. Fails when the JSON is not a tokenizer or no placeholder is left.
Result<std::string> add_v41_markers(std::string_view tokenizer_json, std::vector<std::string>* added = nullptr);

}  // namespace cedar::tokenizer
