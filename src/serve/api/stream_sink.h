// StreamSink: what the generation driver (chat_service) tells a streaming response as the output
// is decoded and parsed. Each API implements it once (openai_schema, responses_schema,
// anthropic_schema) and turns the calls into its own server-sent events, appended to a buffer
// the HTTP layer drains after each batch of tokens.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "serve/api/api_error.h"
#include "serve/api/chat_types.h"

namespace cedar::serve {

class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // Once, before anything else: the turn's id, model and creation time are known.
  virtual void on_start(const Completion& header) = 0;
  virtual void on_reasoning(std::string_view delta) = 0;
  // `logprobs`: the content tokens this delta completes, when the request asked for them (a token
  // belongs to the first delta that shows any of its text).
  virtual void on_content(std::string_view delta, std::span<const TokenLogprob> logprobs) = 0;
  // A complete tool call (the parser emits a call once its invoke block closed). index counts
  // the calls of this turn from 0.
  virtual void on_tool_call(size_t index, const ToolCall& call) = 0;
  // Once, at the end: the whole turn with its finish reason and usage.
  virtual void on_finish(const Completion& done) = 0;
  // Instead of on_finish when generation failed after the stream began.
  virtual void on_error(const ApiError& error) = 0;

  // The event-stream bytes produced since the previous call.
  std::string take() {
    std::string out;
    out.swap(out_);
    return out;
  }

 protected:
  std::string out_;
};

}  // namespace cedar::serve
