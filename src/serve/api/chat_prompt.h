// A neutral chat request -> the V4.1 prompt (text, special spans) and its token ids. The server
// (ChatService) and `cedar render` share it, so what `cedar render` prints is what a request runs.
// Conversion follows DeepSeek's protocol library (deepseek-recipe 0.2.0), which the corpus test
// tests/serve/recipe checks body by body.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "chat/chat_encoding.h"
#include "chat/completion_parser.h"
#include "serve/api/api_error.h"
#include "serve/api/chat_types.h"
#include "tokenizer/tokenizer.h"

namespace cedar::serve {

struct PromptSettings {
  bool default_thinking = true;  // mode when the request says nothing (deepseek-recipe's default)
  chat::PromptFormat format = chat::PromptFormat::kV41;
};

struct RenderedChat {
  chat::ChatPrompt prompt;
  std::vector<int32_t> ids;
  bool thinking = false;
  // Where the completion parser starts: a continued message (Chat `prefix: true`) resumes inside
  // its reasoning or its answer.
  chat::ParseStart parse_start = chat::ParseStart::kNewTurn;
};

// The V4.1 effort of a thinking turn whose request names none: deepseek-recipe's default "high".
inline constexpr int kDefaultEffort = 75;

// The text a forced tool call (tool_choice required or a named function, non-thinking) puts after
// the assistant header, as deepseek-recipe renders it: the model continues inside the DSML block.
inline constexpr std::string_view kForcedCallPrefill = "\n\n<｜DSML｜ calls>\n";
inline std::string forced_call_prefill() { return std::string(kForcedCallPrefill); }

// A declared tool's name must read back from the DSML tool-call format (`invoke name="..."`, parsed
// up to the quote) and be one OpenAI and Anthropic accept: ^[a-zA-Z0-9_-]{1,64}$ (deepseek-recipe
// refuses names outside [a-zA-Z0-9_-]+ too). Returns the 400 that names the tool, the field `path`
// and the rule, or nothing.
inline constexpr size_t kMaxToolNameBytes = 64;
std::optional<ApiError> check_tool_name(const std::string& name, const std::string& path);

// Renders `messages` (the request's, after any replay of generated turns) with the request's tools,
// response format and reasoning options. 400 for what the encoder rejects; 500 when the tokenizer
// lacks a control marker (a server misconfiguration).
std::variant<RenderedChat, ApiError> render_chat_prompt(const ChatRequest& request, const std::vector<Message>& messages,
                                                        const tokenizer::Tokenizer& tokenizer,
                                                        const PromptSettings& settings);

}  // namespace cedar::serve
