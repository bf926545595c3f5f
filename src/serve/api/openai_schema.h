// OpenAI Chat Completions (POST /v1/chat/completions), legacy Completions (POST /v1/completions)
// and Models (GET /v1/models): request parsing into the neutral structs of chat_types.h, response
// bodies, streaming chunks, and the OpenAI error body. Field-by-field behaviour is documented in
// docs/SERVER.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "serve/api/api_error.h"
#include "serve/api/chat_types.h"
#include "serve/api/schema_util.h"
#include "serve/api/stream_sink.h"

namespace cedar::serve {

SchemaError parse_chat_completion_request(const OrderedJson& body, ChatRequest* out);
SchemaError parse_completion_request(const OrderedJson& body, CompletionRequest* out);

std::string render_chat_completion(const Completion& c);
std::string render_text_completion(const Completion& c);
std::string render_openai_error(const ApiError& e);
std::string render_model_list(const std::vector<std::string>& model_ids, int64_t created);
// GET /v1/models/{id}: the model object (200), or OpenAI's 404 error (code model_not_found) for an
// id this server does not serve.
struct ModelLookup {
  int status = 200;
  std::string body;
};
ModelLookup render_model_lookup(const std::vector<std::string>& model_ids, const std::string& requested,
                                int64_t created);
// GET /health: {"status": "ok", "model": ..., "queue": {"waiting": n, "running": m}}.
std::string render_health(const std::string& model_id, int waiting, int running);

// Chat Completions streaming: "data: {chat.completion.chunk}" events, a usage chunk when
// stream_options.include_usage was set, then "data: [DONE]".
class ChatCompletionStream : public StreamSink {
 public:
  explicit ChatCompletionStream(bool include_usage) : include_usage_(include_usage) {}
  void on_start(const Completion& header) override;
  void on_reasoning(std::string_view delta) override;
  void on_content(std::string_view delta, std::span<const TokenLogprob> logprobs) override;
  void on_tool_call(size_t index, const ToolCall& call) override;
  void on_finish(const Completion& done) override;
  void on_error(const ApiError& error) override;

 private:
  void emit_delta(OrderedJson delta, const char* finish_reason,
                  std::optional<std::span<const TokenLogprob>> logprobs = std::nullopt);
  bool include_usage_;
  Completion header_;
};

// Legacy Completions streaming: "data: {text_completion}" events, then "data: [DONE]".
class TextCompletionStream : public StreamSink {
 public:
  explicit TextCompletionStream(bool include_usage) : include_usage_(include_usage) {}
  void on_start(const Completion& header) override { header_ = header; }
  void on_reasoning(std::string_view delta) override {}  // a raw prompt has no reasoning channel
  void on_content(std::string_view delta, std::span<const TokenLogprob> logprobs) override;
  void on_tool_call(size_t index, const ToolCall& call) override {}
  void on_finish(const Completion& done) override;
  void on_error(const ApiError& error) override;

 private:
  bool include_usage_;
  Completion header_;
};

// "stop" / "length" / "tool_calls" (cancelled and failed turns report "stop": nobody reads them).
const char* openai_finish_reason(FinishKind finish);
// The usage object shared by both endpoints (prompt_tokens_details.cached_tokens included).
OrderedJson openai_usage(const Usage& u);

}  // namespace cedar::serve
