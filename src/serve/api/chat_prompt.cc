#include "serve/api/chat_prompt.h"

#include <algorithm>
#include <cctype>

#include "serve/api/prompt_schema.h"
#include "tokenizer/marker_tokens.h"

namespace cedar::serve {
namespace {

bool mentions_json(const std::vector<Message>& messages) {
  for (const Message& m : messages) {
    std::string lower = m.content;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower.find("json") != std::string::npos) return true;
  }
  return false;
}

// Appends deepseek-recipe's prefill of a forced tool call, "\n\n<｜DSML｜ calls>\n", after the
// assistant header: the DSML marker is the encoder's own token, the rest text. (After a finished
// assistant message the encoder has already opened the new turn's header.)
void append_forced_call_prefill(chat::ChatPrompt* prompt) {
  auto add = [&](std::string_view s, chat::SpanKind kind) {
    const size_t at = prompt->text.size();
    prompt->text += s;
    if (kind == chat::SpanKind::kText && !prompt->spans.empty() && prompt->spans.back().kind == kind)
      prompt->spans.back().end = prompt->text.size();
    else
      prompt->spans.push_back({at, prompt->text.size(), kind});
  };
  add("\n\n<", chat::SpanKind::kText);
  add(tokenizer::kDsml, chat::SpanKind::kSpecial);
  add(" calls>\n", chat::SpanKind::kText);
}

}  // namespace

std::optional<ApiError> check_tool_name(const std::string& name, const std::string& path) {
  auto allowed = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  };
  if (!name.empty() && name.size() <= kMaxToolNameBytes && std::all_of(name.begin(), name.end(), allowed))
    return std::nullopt;
  // The name as a JSON string (quotes and control characters escaped), cut at a character boundary.
  size_t cut = std::min<size_t>(name.size(), kMaxToolNameBytes);
  while (cut < name.size() && cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
  const std::string quoted =
      OrderedJson(name.substr(0, cut)).dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  const std::string shown = quoted + (cut < name.size() ? "..." : "");
  return invalid_request("'" + path + "' is " + shown + ": a tool name must match ^[a-zA-Z0-9_-]{1,64}$ (1 to " +
                             std::to_string(kMaxToolNameBytes) + " ASCII letters, digits, underscores or dashes)",
                         path);
}

std::variant<RenderedChat, ApiError> render_chat_prompt(const ChatRequest& request, const std::vector<Message>& messages,
                                                        const tokenizer::Tokenizer& tokenizer,
                                                        const PromptSettings& settings) {
  const bool thinking = request.reasoning.thinking.value_or(settings.default_thinking);
  // deepseek-recipe's rule: a trailing assistant message is a finished turn and a new one follows,
  // unless it asks to be continued (Chat Completions' `prefix: true`, checked by the API parser).
  const bool continued = !messages.empty() && messages.back().role == Role::kAssistant && messages.back().prefix;
  // Checked on the request's own messages: a replayed turn no longer lists its calls.
  if (!request.messages.empty() && request.messages.back().role == Role::kAssistant &&
      !request.messages.back().tool_calls.empty())
    return invalid_request(
        "the last message is an assistant turn with tool calls: send each call's result after it (a tool message, "
        "function_call_output item or tool_result block), as DeepSeek's API requires",
        "messages");
  if (request.response_format && *request.response_format == json_object_format() && !mentions_json(messages))
    return invalid_request(
        "the conversation must contain the word 'json' in some form to ask for a json_object response format "
        "(as DeepSeek's API requires)",
        "response_format");
  if (request.tool_call_required && thinking)
    return invalid_request("thinking mode does not support this tool_choice: a forced tool call needs thinking off",
                           "tool_choice");
  const OrderedJson encoder_input = encoder_messages(messages, request.tools, request.response_format, continued);

  chat::ChatOptions options;
  options.format = settings.format;
  options.plain_image_placeholder_text = true;
  options.recipe_turns = true;
  options.thinking_mode = thinking ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
  if (settings.format == chat::PromptFormat::kV41) options.reasoning_effort = request.reasoning.effort.value_or(kDefaultEffort);
  auto prompt = chat::encode_chat(encoder_input, options);
  if (!prompt.ok()) return invalid_request("the conversation cannot be encoded: " + prompt.status().message());
  if (request.tool_call_required) append_forced_call_prefill(&*prompt);
  auto ids = chat::encode_chat_ids(tokenizer, *prompt, settings.format);
  if (!ids.ok()) {
    if (ids.status().code() == StatusCode::kInvalidArgument)
      return invalid_request("the conversation cannot be tokenized: " + ids.status().message());
    return ApiError{ErrorKind::kInternal, "server misconfiguration: " + ids.status().message(), ""};
  }
  RenderedChat out;
  out.prompt = std::move(*prompt);
  out.ids = std::move(*ids);
  out.thinking = thinking;
  if (continued && thinking) {
    // Where the model resumes (deepseek-recipe's ThinkingInitialStage): in the answer once it has
    // begun, else in the reasoning the message carries (none: as a new turn's reasoning).
    const Message& last = messages.back();
    out.parse_start = !last.content.empty()  ? chat::ParseStart::kContentContinuation
                      : !last.reasoning.empty() ? chat::ParseStart::kReasoningContinuation
                                                : chat::ParseStart::kNewTurn;
  }
  return out;
}

}  // namespace cedar::serve
