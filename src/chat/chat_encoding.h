// DeepSeek chat prompt encoding: OpenAI-style messages -> prompt text -> ids, reproducing the
// official encoders byte for byte (V4.1: `encoding/encoding.py` of DeepSeek-V4.1-Flash, spec §6.2;
// V4: `encoding/encoding_dsv4.py` of DeepSeek-V4-Flash, spec §6.3).
//
// Messages are a JSON array of objects with "role" system | user | assistant | tool |
// latest_reminder (V4 also "developer"). Tools ride on a message's "tools" (OpenAI format; they
// are rendered into the prompt only on a system message), tool calls on an assistant's
// "tool_calls", tool results are "tool" messages with "tool_call_id". Content may be a string or
// a list of content blocks (text, image_url/image, tool_result).
//
// What the encoder does (V4.1):
//  * BOS once; `<｜System｜>` opens the prompt when the first message is a system message or the
//    mode is thinking (then "Reasoning Effort: N (range 1-100, ...)" follows it);
//  * later system messages render as `<｜System｜>text` and, like user turns, get the assistant
//    header when no assistant turn follows;
//  * tool results merge into the following user turn as <tool_result> blocks in call order;
//  * assistant turns carry reasoning (thinking mode), content and spaced-DSML tool calls;
//  * drop_thinking (default) removes reasoning before the last user turn, and is switched off
//    automatically when any message has tools;
//  * reasoning effort: integer 1..100 or low/high/xhigh/max (25/50/75/100), default high; it is
//    validated in every mode but rendered only in thinking mode at message 0.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace cedar::chat {

enum class PromptFormat {
  kV41,  // DeepSeek-V4.1 (the default): <｜System｜>, numeric effort, spaced DSML
  kV4,   // DeepSeek-V4: system text after BOS, effort high|max, unspaced DSML
};

enum class ThinkingMode { kChat, kThinking };

struct ChatOptions {
  PromptFormat format = PromptFormat::kV41;
  ThinkingMode thinking_mode = ThinkingMode::kChat;
  bool drop_thinking = true;
  bool add_bos = true;
  // The official encoder refuses text that spells the image placeholder. With this set, such text is
  // plain text like any other (deepseek-recipe's behaviour; the server sets it, as it takes no
  // images and every placeholder would be a client's spelling).
  bool plain_image_placeholder_text = false;
  // deepseek-recipe's turns (the server sets it; the official encoder leaves a trailing assistant
  // message open): every assistant message is a turn of its own (one that follows another assistant
  // message or opens the conversation gets its own `<｜Assistant｜>` header), a conversation that
  // ends with a finished assistant message (no "wo_eos") ends with the header of a new turn, and
  // drop_thinking keeps the reasoning of the turn being generated only: the new one, or the final
  // "wo_eos" message the model continues. That message, in thinking mode, without content or
  // tool calls, leaves its reasoning open (no `</think>`).
  bool recipe_turns = false;
  // null = the format's default; V4.1: an integer 1..100 or "low"|"high"|"xhigh"|"max";
  // V4: "high" or "max".
  nlohmann::ordered_json reasoning_effort = nullptr;
};

// How a stretch of the prompt text becomes ids.
enum class SpanKind {
  kText,       // anything a client wrote, and the template's prose: encoded without added tokens
  kSpecial,    // one control marker the encoder itself placed: exactly one added token
  kModelText,  // text this server's model generated (a replayed turn): encoded with added tokens,
               // so its markers come back as the tokens the model produced
};

struct PromptSpan {
  size_t begin = 0, end = 0;  // byte offsets into ChatPrompt::text
  SpanKind kind = SpanKind::kText;
};

struct ChatPrompt {
  std::string text;
  // Cover `text` in order, without gaps; neighbouring text spans are merged (the tokenizer
  // pre-tokenises each span on its own, as DeepSeek's encoders do between special ranges).
  std::vector<PromptSpan> spans;
  // URLs (or inline data) of the images whose <｜deepseek_image｜> placeholders the prompt holds,
  // in prompt order (V4.1 only; the vision path consumes them).
  std::vector<std::string> images;
};

// Encodes messages into prompt text. Inputs the official encoder rejects are InvalidArgument
// errors carrying the official message text (e.g. "Invalid reasoning effort for deepseek_v41:
// 0, should be int within [1,100] or ['low', 'high', 'xhigh', 'max']").
Result<ChatPrompt> encode_chat(const nlohmann::ordered_json& messages, const ChatOptions& options);

// The same from JSON text (an array of messages, or an object with "messages" and optional
// "tools", which are attached to the first message as the official load_cases does).
Result<ChatPrompt> encode_chat_json(std::string_view messages_json, const ChatOptions& options);

// The byte ranges of the prompt's special spans, ascending (deepseek-recipe's special_ranges, in
// bytes rather than code points).
std::vector<std::pair<size_t, size_t>> special_ranges(const ChatPrompt& prompt);

// Encodes the prompt into ids span by span: each special span is its single token, text spans are
// encoded without added tokens (so a marker a client spelled stays plain text), model text with
// them. BOS is part of the text, so no special tokens are added. A special span that is not a single
// token of `tokenizer` (e.g. <｜System｜> with V4's tokenizer, where id 128799 is a placeholder) is a
// FailedPrecondition error naming the missing marker.
Result<std::vector<tokenizer::TokenId>> encode_chat_ids(const tokenizer::Tokenizer& tokenizer, const ChatPrompt& prompt,
                                                        PromptFormat format);

// Checks a reasoning effort for `format` alone (what encode_chat reports for a bad one).
Status validate_reasoning_effort(const nlohmann::ordered_json& effort, PromptFormat format);

// Parses a reasoning-effort flag value: digits -> integer, anything else -> string alias.
nlohmann::ordered_json reasoning_effort_from_flag(const std::string& flag);

// An assistant message with this key set to true carries content and reasoning_content that this
// server's model generated (a replayed turn): they become SpanKind::kModelText rather than text.
inline constexpr const char* kModelTextKey = "cedar_model_text";

// DSML tag names of a format: V4.1 " calls"/" invoke"/" parameter", V4 "tool_calls"/"invoke"/
// "parameter" (the tags are "<" + tokenizer::kDsml + name ...).
struct DsmlNames {
  std::string_view calls, invoke, parameter;
};
DsmlNames dsml_names(PromptFormat format);

}  // namespace cedar::chat
