// ChatService: the API-independent middle of the server (and of `cedar chat`). It
//   1. renders a neutral request into a V4.1 prompt (chat/chat_encoding) and token ids,
//      replaying earlier tool-call turns byte for byte (ReplayStore) so the prompt's prefix is
//      the very token sequence the engine generated, and the prefix cache hits;
//   2. checks the per-request limits (prompt length, output budget) and submits to the engine,
//      whose bounded queue is the server's only one (429 when full);
//   2b. gives a request with an output constraint (output_constraint.h) its grammar matcher, which
//      the engine masks the logits with (constrained decoding). prepare_chat only records the
//      constraint; submit() compiles it, so the HTTP layer's key slots and token rate limits come
//      first and a costly grammar is never paid for a request that would be refused anyway;
//   3. follows the generation's stream on the calling thread: decodes, parses and streams the
//      output (OutputAssembler -> StreamSink), detects a client that went away through the flush
//      callback, and cancels the generation then. It sleeps on the stream between tokens (no
//      polling), waking for a keep-alive when a stream has been silent for a while.
// No JSON and no locks here: the schemas own the wire formats, the engine's stream the hand-off.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <variant>

#include "constrain/grammar_engine.h"
#include "runtime/engine.h"
#include "serve/api/api_error.h"
#include "serve/api/chat_types.h"
#include "serve/api/image_inputs.h"
#include "serve/api/output_assembler.h"
#include "serve/api/stream_sink.h"
#include "serve/api/replay_store.h"
#include "chat/chat_encoding.h"
#include "tokenizer/tokenizer.h"

namespace cedar::serve {

struct ServiceConfig {
  std::string model_id;             // the served model's name (requests may name any model)
  // Mode when the request says nothing: thinking, as deepseek-recipe's ConversionOptions() and
  // DeepSeek's API (`cedar serve --thinking off` chooses chat).
  bool default_thinking = true;
  int default_max_tokens = 4096;    // output budget when the request names none, and the most one may ask
                                    // (a larger max_tokens is clamped to it)
  int max_prompt_tokens = 0;        // longest prompt accepted; 0 = the engine's context
  chat::PromptFormat format = chat::PromptFormat::kV41;
  constrain::GrammarEngineOptions grammar;  // compile threads, deadline, grammar cache budget
  ImageInputLimits images;                  // bytes, pixels, count and tokens of a request's images
};

struct PreparedGeneration {
  runtime::GenerationRequest request;  // prompt ids and sampling
  OutputSettings output;
  Completion header;                   // id, created, model of the turn
  // The output constraint submit() compiles and starts (request.constraint), when there is one.
  std::optional<constrain::ConstraintSpec> constraint;
};

class ChatService {
 public:
  ChatService(const tokenizer::Tokenizer& tokenizer, runtime::Engine& engine, ReplayStore& replay,
              ServiceConfig config);

  // Renders and tokenizes. 400 for what the encoder rejects, a prompt over the limit, or an empty
  // output budget. `id_prefix` starts the turn's id, `tool_id_prefix` its tool call ids.
  std::variant<PreparedGeneration, ApiError> prepare_chat(const ChatRequest& request, std::string_view id_prefix,
                                                          std::string_view tool_id_prefix) const;
  std::variant<PreparedGeneration, ApiError> prepare_completion(const CompletionRequest& request) const;

  // Starts the output constraint (compiling its grammar on the grammar engine's threads, waiting at
  // most its deadline, and no longer once `cancelled` returns true), then submits the generation.
  // 400 for a constraint that cannot be compiled or enforced within max_tokens, 503 when the
  // compile queue is full, 429 (with Retry-After) when the engine's queue is full.
  std::variant<std::shared_ptr<runtime::GenerationStream>, ApiError> submit(
      PreparedGeneration& prepared, const std::function<bool()>& cancelled = {});

  // Called after output was produced (idle = false) or after a quiet interval (idle = true: a
  // streaming response writes a keep-alive). Returns false when the client is gone.
  using Flush = std::function<bool(bool idle)>;
  // Follows `stream` to its end, streaming into `sink` (null for a non-streaming response). Returns
  // the finished turn, or the error (already told to the sink when there is one).
  std::variant<Completion, ApiError> follow(const PreparedGeneration& prepared, runtime::GenerationStream& stream,
                                            StreamSink* sink, const Flush& flush);

  const ServiceConfig& config() const { return config_; }
  const runtime::EngineInfo& engine_info() const { return info_; }
  // Seconds a refused client should wait: one round of the engine's batch per max_batch queued
  // requests, at least 1.
  int retry_after_seconds() const;

 private:
  // Restores tool-call turns the server generated to their exact text (see ReplayStore).
  std::vector<Message> replay_turns(const std::vector<Message>& messages) const;
  // Whether a finished tool-call turn may be remembered for replay: its reasoning and `raw` text,
  // encoded as model text (with added tokens), must hold exactly the control tokens the model
  // generated (and the prompt's own `output_prefix`). A marker the model spelled with ordinary
  // tokens, e.g. copied from a client's text, would otherwise come back as a control token.
  bool markers_as_generated(const runtime::GenerationResult& result, const OutputSettings& output,
                            const std::string& reasoning, const std::string& raw) const;
  std::variant<PreparedGeneration, ApiError> finish_prepare(std::vector<int32_t> prompt_ids,
                                                            const SamplingOptions& sampling, OutputSettings output,
                                                            std::string_view id_prefix, const std::string& model) const;

  // The grammar engine of constrained decoding, built on the first request that needs it (building
  // xgrammar's view of the 129k-token vocabulary is not free, and most requests never need it).
  constrain::GrammarEngine* grammar() const;
  // Compiles and starts prepared.constraint into prepared.request.constraint.
  std::optional<ApiError> start_constraint(PreparedGeneration& prepared, const std::function<bool()>& cancelled);

  const tokenizer::Tokenizer& tokenizer_;
  std::unordered_set<int32_t> added_ids_;  // the tokenizer's added (control) tokens
  std::optional<int32_t> eos_id_;          // ends a turn; never part of its text
  mutable std::once_flag grammar_once_;
  mutable std::unique_ptr<constrain::GrammarEngine> grammar_;
  mutable Status grammar_status_;
  runtime::Engine& engine_;
  ReplayStore& replay_;
  const ServiceConfig config_;
  const runtime::EngineInfo info_;
};

}  // namespace cedar::serve
