// OpenAI Responses API (POST /v1/responses), the subset coding agents use (Codex CLI): input items
// (messages, function_call, function_call_output, reasoning), function tools, reasoning effort,
// text.format, streaming events. Stateless: previous_response_id is refused (nothing is stored),
// so clients send the whole conversation as input, as Codex does with store=false.
//
// Reasoning items carry the thinking text in `content` (reasoning_text) and, because stateless
// clients return `encrypted_content` rather than the text, also in `encrypted_content`: cedar does
// not encrypt it (the server is local), it only lets the text make the round trip.
#pragma once

#include <string>
#include <vector>

#include "serve/api/api_error.h"
#include "serve/api/chat_types.h"
#include "serve/api/schema_util.h"
#include "serve/api/stream_sink.h"

namespace cedar::serve {

SchemaError parse_responses_request(const OrderedJson& body, ChatRequest* out);

std::string render_response(const Completion& c);

// The event sequence of a streamed response: response.created, response.in_progress, then per
// output item (reasoning, message, function_call) output_item.added / content deltas / done
// events, then response.completed (or response.incomplete when max_output_tokens cut it).
class ResponsesStream : public StreamSink {
 public:
  void on_start(const Completion& header) override;
  void on_reasoning(std::string_view delta) override;
  void on_content(std::string_view delta, std::span<const TokenLogprob> logprobs) override;
  void on_tool_call(size_t index, const ToolCall& call) override;
  void on_finish(const Completion& done) override;
  void on_error(const ApiError& error) override;

 private:
  enum class Open { kNone, kReasoning, kMessage, kFunctionCall };
  void event(const char* type, OrderedJson payload);
  // Ends the open item with output_item.done of this status.
  void close_open_item(const char* status = "completed");
  Completion header_;
  int sequence_ = 0;
  int output_index_ = -1;
  Open open_ = Open::kNone;
  std::string item_id_;
  std::string text_;  // text of the open item so far
  std::vector<TokenLogprob> logprobs_;  // of the open message item's tokens so far
  OrderedJson function_call_;  // the open function_call item (Open::kFunctionCall)
  OrderedJson items_ = OrderedJson::array();  // finished output items, for response.completed
};

}  // namespace cedar::serve
