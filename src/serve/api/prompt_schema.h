// The V4.1 prompt encoder's input (chat/chat_encoding.h reads OpenAI-style messages JSON),
// built from a neutral request. Tool definitions and the response format ride on the first
// message, which must be a system message for the encoder to print them: when the conversation
// has none, an empty one is put first (the official encoder ignores tools on other roles).
#pragma once

#include <optional>
#include <vector>

#include "serve/api/chat_types.h"

namespace cedar::serve {

// `continue_last`: the last message is an assistant message the model continues (Chat `prefix: true`;
// no EOS after it).
OrderedJson encoder_messages(const std::vector<Message>& messages, const std::vector<OrderedJson>& tools,
                             const std::optional<OrderedJson>& response_format, bool continue_last = false);

// True when two tool-call argument texts hold the same JSON value (key order and spacing aside).
bool same_arguments(const std::string& a, const std::string& b);

// The parsed argument object of a tool call (for Anthropic's tool_use.input); an empty object when
// the text is not a JSON object (malformed arguments: deepseek-recipe's message has {} too).
OrderedJson arguments_object(const std::string& arguments);

}  // namespace cedar::serve
