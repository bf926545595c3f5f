// Anthropic Messages API (POST /v1/messages, as Claude Code speaks it): system prompt, content
// blocks (text, tool_use, tool_result, thinking), tools, thinking controls, stop sequences,
// streaming events, and the Anthropic error body.
//
// Thinking: {"type": "enabled" | "adaptive"} turns V4.1's thinking mode on, "disabled" off;
// output_config.effort (a word, or cedar's extension: an integer 1..100) sets the effort. V4.1
// has no token budget for reasoning, so thinking.budget_tokens is accepted but does not cut the
// reasoning (max_tokens still bounds the whole turn).
#pragma once

#include <string>

#include "serve/api/api_error.h"
#include "serve/api/chat_types.h"
#include "serve/api/schema_util.h"
#include "serve/api/stream_sink.h"

namespace cedar::serve {

// `for_counting`: POST /v1/messages/count_tokens, where max_tokens is not required.
SchemaError parse_messages_request(const OrderedJson& body, ChatRequest* out, bool for_counting = false);

std::string render_message(const Completion& c);
// POST /v1/messages/count_tokens: {"input_tokens": n}.
std::string render_token_count(int input_tokens);
std::string render_anthropic_error(const ApiError& e);

// message_start, then per content block (thinking, text, tool_use) content_block_start /
// *_delta / content_block_stop, then message_delta (stop reason, final usage) and message_stop.
class MessagesStream : public StreamSink {
 public:
  void on_start(const Completion& header) override;
  void on_reasoning(std::string_view delta) override;
  void on_content(std::string_view delta, std::span<const TokenLogprob> logprobs) override;
  void on_tool_call(size_t index, const ToolCall& call) override;
  void on_finish(const Completion& done) override;
  void on_error(const ApiError& error) override;

 private:
  enum class Open { kNone, kThinking, kText };
  void event(const char* type, OrderedJson payload);
  void close_open_block();
  // A thinking turn whose reasoning is empty still gets its (empty) thinking block first.
  void open_empty_thinking_block();
  bool header_thinking_ = false;
  Open open_ = Open::kNone;
  int block_index_ = -1;
  std::string thinking_;  // the open thinking block's text (its signature is derived from it)
};

}  // namespace cedar::serve
