#include "serve/chat_prompt.h"

#include "serve/prompt_schema.h"

namespace cedar::serve {

std::variant<RenderedChat, ApiError> render_chat_prompt(const ChatRequest& request, const std::vector<Message>& messages,
                                                        const tokenizer::Tokenizer& tokenizer,
                                                        const PromptSettings& settings) {
  const bool thinking = request.reasoning.thinking.value_or(settings.default_thinking);
  const bool prefill = !messages.empty() && messages.back().role == Role::kAssistant;
  if (prefill && (thinking || !messages.back().tool_calls.empty()))
    return invalid_request(
        "the last message is an assistant turn: cedar continues a partial assistant answer in non-thinking "
        "mode only, and never one with tool calls",
        "messages");
  const OrderedJson encoder_input = encoder_messages(messages, request.tools, request.response_format, prefill);

  tokenizer::ChatOptions options;
  options.format = settings.format;
  options.thinking_mode = thinking ? tokenizer::ThinkingMode::kThinking : tokenizer::ThinkingMode::kChat;
  if (settings.format == tokenizer::PromptFormat::kV41) options.reasoning_effort = request.reasoning.effort.value_or(kDefaultEffort);
  auto prompt = tokenizer::encode_chat(encoder_input, options);
  if (!prompt.ok()) return invalid_request("the conversation cannot be encoded: " + prompt.status().message());
  auto ids = tokenizer::encode_chat_ids(tokenizer, *prompt, settings.format);
  if (!ids.ok()) {
    if (ids.status().code() == StatusCode::kInvalidArgument)
      return invalid_request("the conversation cannot be tokenized: " + ids.status().message());
    return ApiError{ErrorKind::kInternal, "server misconfiguration: " + ids.status().message(), ""};
  }
  RenderedChat out;
  out.prompt = std::move(*prompt);
  out.ids = std::move(*ids);
  out.thinking = thinking;
  return out;
}

}  // namespace cedar::serve
