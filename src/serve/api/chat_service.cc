#include "serve/api/chat_service.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <random>

#include "core/log.h"
#include "serve/api/chat_prompt.h"
#include "serve/api/output_constraint.h"
#include "serve/api/prompt_schema.h"
#include "tokenizer/marker_tokens.h"
#include "serve/api/schema_util.h"

namespace cedar::serve {
namespace {

// How long a stream may stay silent before a keep-alive goes out (a vanished client is learnt from
// the failed write then, or at once from the transport, which cancels the stream).
constexpr auto kKeepAliveAfter = std::chrono::seconds(2);

bool same_calls(const std::vector<ToolCall>& client, const std::vector<ToolCall>& generated) {
  if (client.size() != generated.size()) return false;
  for (size_t i = 0; i < client.size(); ++i) {
    if (client[i].id != generated[i].id || client[i].name != generated[i].name ||
        !same_arguments(client[i].arguments, generated[i].arguments))
      return false;
  }
  return true;
}

uint64_t fresh_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

}  // namespace

ChatService::ChatService(const tokenizer::Tokenizer& tokenizer, runtime::Engine& engine, ReplayStore& replay,
                         ServiceConfig config)
    : tokenizer_(tokenizer),
      eos_id_(tokenizer.token_to_id(tokenizer::kEos)),
      engine_(engine),
      replay_(replay),
      config_(std::move(config)),
      info_(engine.info()) {
  for (const tokenizer::AddedToken& t : tokenizer.added_tokens()) added_ids_.insert(t.id);
}

bool ChatService::markers_as_generated(const runtime::GenerationResult& result, const OutputSettings& output,
                                       const std::string& reasoning, const std::string& raw) const {
  auto added_in = [&](const std::string& text) -> std::optional<size_t> {
    auto ids = tokenizer_.encode(text, /*add_special=*/false);  // as encode_chat_ids encodes model text
    if (!ids.ok()) return std::nullopt;
    return std::count_if(ids->begin(), ids->end(), [&](int32_t id) { return added_ids_.contains(id); });
  };
  size_t generated = 0;
  for (int32_t id : result.output_ids)
    if (id != eos_id_ && added_ids_.contains(id)) ++generated;
  // Thinking mode: the `</think>` token that ended the reasoning is the encoder's own in the replay.
  const size_t think_end = output.thinking == chat::ThinkingMode::kThinking ? 1 : 0;
  const std::optional<size_t> in_reasoning = added_in(reasoning), in_raw = added_in(raw),
                              in_prefix = added_in(output.output_prefix);
  return in_reasoning && in_raw && in_prefix && *in_reasoning + think_end + *in_raw == generated + *in_prefix;
}

constrain::GrammarEngine* ChatService::grammar() const {
  std::call_once(grammar_once_, [&] {
    auto engine = constrain::GrammarEngine::create(tokenizer_, info_.vocab_size, config_.grammar);
    if (engine.ok()) {
      grammar_ = std::move(*engine);
    } else {
      grammar_status_ = engine.status();
      CEDAR_LOG_WARN("constrained decoding unavailable: %s", grammar_status_.to_string().c_str());
    }
  });
  return grammar_.get();
}

std::vector<Message> ChatService::replay_turns(const std::vector<Message>& messages) const {
  std::vector<Message> out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    Message& m = out[i];
    if (m.role != Role::kAssistant || m.tool_calls.empty()) continue;
    std::optional<ReplayTurn> turn = replay_.find(m.tool_calls.front().id);
    if (!turn || !same_calls(m.tool_calls, turn->calls) || m.content != turn->content) continue;
    // The replayed turn is encoded as model text (its markers become the tokens the model wrote), so
    // it may carry nothing the client wrote: reasoning the client sent other than the generated one
    // is the client's text, and the turn renders canonically, its text plain like any client text.
    if (!m.reasoning.empty() && m.reasoning != turn->reasoning) continue;
    // The encoder orders tool results like the calls of the assistant turn before them; that turn is
    // about to become plain text, so order its results here (stable, unknown ids last).
    size_t end = i + 1;
    while (end < out.size() && out[end].role == Role::kTool) ++end;
    auto rank = [&](const Message& tool) {
      for (size_t k = 0; k < turn->calls.size(); ++k)
        if (turn->calls[k].id == tool.tool_call_id) return k;
      return turn->calls.size();
    };
    std::stable_sort(out.begin() + i + 1, out.begin() + end,
                     [&](const Message& a, const Message& b) { return rank(a) < rank(b); });
    // The exact generated text: content and DSML as the model wrote them. Reasoning the client did
    // not send back (most Chat Completions clients drop reasoning_content) is restored too: V4.1
    // keeps the reasoning of tool-call turns in the prompt.
    m.content = std::move(turn->raw);
    m.tool_calls.clear();
    m.reasoning = std::move(turn->reasoning);
    m.model_text = true;
  }
  return out;
}

std::variant<PreparedGeneration, ApiError> ChatService::prepare_chat(const ChatRequest& request,
                                                                     std::string_view id_prefix,
                                                                     std::string_view tool_id_prefix) const {
  if (SchemaError e = check_output_constraint(request)) return *e;  // constraint limits, before any work
  PromptSettings settings;
  settings.default_thinking = config_.default_thinking;
  settings.format = config_.format;
  auto rendered = render_chat_prompt(request, replay_turns(request.messages), tokenizer_, settings);
  if (const ApiError* e = std::get_if<ApiError>(&rendered)) return *e;
  RenderedChat& chat = std::get<RenderedChat>(rendered);
  OutputSettings output;
  output.mode = OutputMode::kChat;
  output.thinking = chat.thinking ? chat::ThinkingMode::kThinking : chat::ThinkingMode::kChat;
  output.stop = request.sampling.stop;
  output.tool_id_prefix = std::string(tool_id_prefix);
  output.parse_tool_calls = !request.tools.empty();
  output.parse_json_output = request.parse_json_output;
  if (request.tool_call_required) output.output_prefix = forced_call_prefill();
  output.parse_start = chat.parse_start;
  // Images (V4.1 image blocks, in prompt order): each placeholder of the ids becomes its span.
  std::shared_ptr<model::SequenceImages> images;
  if (!chat.prompt.images.empty()) {
    // prepare_vl_inputs' check: the tokenizer's placeholder is the config's image_token_id.
    const auto placeholder = tokenizer_.token_to_id(tokenizer::kImagePlaceholder);
    if (info_.vision.present && placeholder && *placeholder != info_.image_token_id)
      return ApiError{ErrorKind::kInternal,
                      "server misconfiguration: the tokenizer's image placeholder is id " +
                          std::to_string(*placeholder) + " but config.json's image_token_id is " +
                          std::to_string(info_.image_token_id),
                      ""};
    std::vector<EncodedImage> encoded;
    for (size_t i = 0; i < chat.prompt.images.size(); ++i) {
      const std::string name = "image " + std::to_string(i + 1);
      auto bytes = image_url_bytes(chat.prompt.images[i], name);
      if (!bytes.ok()) return invalid_request(bytes.status().message(), "messages");
      encoded.push_back({name, std::move(*bytes)});
    }
    auto spans = expand_image_placeholders(chat.ids, encoded, info_.image_token_id, info_.vision, config_.images);
    if (!spans.ok()) return invalid_request(spans.status().message(), "messages");
    images = std::move(*spans);
  }
  auto prepared = finish_prepare(std::move(chat.ids), request.sampling, std::move(output), id_prefix, request.model);
  auto* p = std::get_if<PreparedGeneration>(&prepared);
  if (!p) return prepared;
  p->request.images = std::move(images);
  p->header.responses_echo = request.responses_echo;
  p->header.thinking = chat.thinking;
  const bool continued = !request.messages.empty() && request.messages.back().prefix;
  if (continued && request.answer_constraint)
    return invalid_request(
        "a continued assistant message ('prefix': true) cannot take a json_schema or regex response format: cedar "
        "enforces a format from the start of the answer; drop 'prefix' or the format",
        "response_format");
  // Compiled in submit(), after the HTTP layer's rate limits.
  p->constraint = output_constraint(request, chat.thinking);
  return prepared;
}

std::variant<PreparedGeneration, ApiError> ChatService::prepare_completion(const CompletionRequest& request) const {
  auto ids = tokenizer_.encode(request.prompt, /*add_special=*/false);
  if (!ids.ok()) return invalid_request("the prompt cannot be tokenized: " + ids.status().message(), "prompt");
  OutputSettings output;
  output.mode = OutputMode::kRaw;
  output.stop = request.sampling.stop;
  return finish_prepare(std::move(*ids), request.sampling, std::move(output), "cmpl-", request.model);
}

std::variant<PreparedGeneration, ApiError> ChatService::finish_prepare(std::vector<int32_t> prompt_ids,
                                                                       const SamplingOptions& sampling,
                                                                       OutputSettings output,
                                                                       std::string_view id_prefix,
                                                                       const std::string& model) const {
  const int64_t n = static_cast<int64_t>(prompt_ids.size());
  if (n == 0) return invalid_request("the prompt is empty");
  const int64_t context = info_.max_context;
  int64_t limit = context > 0 ? context - 1 : INT_MAX;  // room for at least one output token
  if (config_.max_prompt_tokens > 0) limit = std::min<int64_t>(limit, config_.max_prompt_tokens);
  if (n > limit)
    return ApiError{ErrorKind::kContextTooLong,
                    "the prompt has " + std::to_string(n) + " tokens; this server accepts at most " +
                        std::to_string(limit) + " (model context " + std::to_string(context) +
                        " tokens): shorten the conversation",
                    "messages"};
  int64_t budget = sampling.max_tokens > 0 ? sampling.max_tokens : config_.default_max_tokens;
  // --max-tokens is also the cap: a larger max_tokens is clamped to it (the turn ends with "length"),
  // as the context clamp below, since clients send large budgets by habit (docs/SERVER.md).
  budget = std::min<int64_t>(budget, config_.default_max_tokens);
  // A budget larger than what the context has left is clamped (the turn ends with "length"),
  // rather than refused: agents ask for large budgets by habit.
  if (context > 0) budget = std::min(budget, context - n);

  PreparedGeneration prepared;
  prepared.request.prompt_ids = std::move(prompt_ids);
  prepared.request.sampling.temperature = sampling.temperature;
  prepared.request.sampling.seed = sampling.seed.value_or(fresh_seed());
  prepared.request.sampling.max_tokens = static_cast<int>(budget);
  prepared.request.logprobs = sampling.logprobs;
  prepared.request.top_logprobs = sampling.logprobs ? sampling.top_logprobs : 0;
  prepared.output = std::move(output);
  prepared.output.logprobs = sampling.logprobs;
  prepared.header.id = random_id(id_prefix);
  prepared.header.created = unix_seconds_now();
  prepared.header.model = model.empty() ? config_.model_id : model;
  prepared.header.has_logprobs = sampling.logprobs;
  prepared.header.usage.prompt_tokens = static_cast<int>(n);  // known now; cached tokens at the end
  return prepared;
}

std::optional<ApiError> ChatService::start_constraint(PreparedGeneration& prepared,
                                                     const std::function<bool()>& cancelled) {
  if (!prepared.constraint || prepared.request.constraint) return std::nullopt;
  const constrain::ConstraintSpec& spec = *prepared.constraint;
  const bool tools = spec.kind == constrain::ConstraintKind::kToolCall ||
                     spec.kind == constrain::ConstraintKind::kToolCallRequired;
  const std::string what = tools ? "the tools' parameter schemas" : "the response format";
  const char* field = tools ? "tools" : "response_format";
  constrain::GrammarEngine* engine = grammar();
  if (!engine)
    return invalid_request("this server cannot constrain its output (" + grammar_status_.message() + "), which " +
                               what + " needs",
                           field);
  auto constraint = engine->start(spec, cancelled);
  if (!constraint.ok()) {
    const Status& st = constraint.status();
    if (st.code() == StatusCode::kResourceExhausted || st.code() == StatusCode::kFailedPrecondition)
      return ApiError{ErrorKind::kOverloaded, st.message(), ""};
    return invalid_request(what + " cannot be enforced: " + st.message(), field);
  }
  // A forced tool call cut by max_tokens would be partial JSON: refuse a budget no complete call fits.
  if (spec.kind == constrain::ConstraintKind::kToolCallRequired) {
    const int needed = (*constraint)->tokens_to_complete();
    if (needed > prepared.request.sampling.max_tokens)
      return invalid_request("max_tokens " + std::to_string(prepared.request.sampling.max_tokens) +
                                 " is below the " + std::to_string(needed) +
                                 " tokens a complete tool call needs (tool_choice forces one); raise max_tokens",
                             "max_tokens");
  }
  prepared.request.constraint = std::move(*constraint);
  return std::nullopt;
}

int ChatService::retry_after_seconds() const {
  return 1 + engine_.stats().queue_depth / std::max(1, info_.max_batch);
}

std::variant<std::shared_ptr<runtime::GenerationStream>, ApiError> ChatService::submit(
    PreparedGeneration& prepared, const std::function<bool()>& cancelled) {
  if (std::optional<ApiError> error = start_constraint(prepared, cancelled)) return *error;
  auto stream = engine_.submit(prepared.request);
  if (stream.ok()) return std::move(*stream);
  switch (stream.status().code()) {
    case StatusCode::kResourceExhausted: return ApiError{ErrorKind::kRateLimited, stream.status().message(), ""};
    case StatusCode::kInvalidArgument: return api_error_from_status(stream.status());
    default: return ApiError{ErrorKind::kOverloaded, stream.status().message(), ""};
  }
}

std::variant<Completion, ApiError> ChatService::follow(const PreparedGeneration& prepared,
                                                       runtime::GenerationStream& stream, StreamSink* sink,
                                                       const Flush& flush) {
  OutputAssembler assembler(tokenizer_, prepared.output, sink);
  if (sink) sink->on_start(prepared.header);
  bool client_gone = !flush(false);
  auto last_output = std::chrono::steady_clock::now();
  for (;;) {
    if (client_gone) stream.cancel();
    runtime::GenerationStream::Update update = stream.next(last_output + kKeepAliveAfter);
    for (size_t i = 0; i < update.tokens.size(); ++i) assembler.push(update.tokens[i], update.logprobs, i);
    if (assembler.wants_stop()) stream.cancel();
    const auto now = std::chrono::steady_clock::now();
    if (!update.tokens.empty()) {
      if (!client_gone) client_gone = !flush(false);
      last_output = now;
    } else if (!update.finished && now - last_output >= kKeepAliveAfter) {
      if (!client_gone) client_gone = !flush(true);
      last_output = now;
    }
    if (update.finished) break;
  }

  const Result<runtime::GenerationResult>& result = stream.result();
  if (!result.ok()) {
    ApiError error = api_error_from_status(result.status());
    if (sink) {
      sink->on_error(error);
      flush(false);
    }
    return error;
  }
  Completion turn = prepared.header;
  if (std::optional<ApiError> error = assembler.finish(*result, &turn)) {
    if (sink) {
      sink->on_error(*error);
      flush(false);
    }
    return *error;
  }
  if (sink) {
    sink->on_finish(turn);
    flush(false);
  }
  // Without a replayable text the turn's calls are rendered from the client's message as usual.
  std::optional<std::string> raw = assembler.raw_after_reasoning();
  if (prepared.output.mode == OutputMode::kChat && !turn.tool_calls.empty() && turn.finish == FinishKind::kToolCalls &&
      raw && markers_as_generated(*result, prepared.output, turn.reasoning, *raw))
    replay_.remember({turn.tool_calls, turn.content, turn.reasoning, std::move(*raw)});
  return turn;
}

}  // namespace cedar::serve
