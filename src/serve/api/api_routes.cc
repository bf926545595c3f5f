// The routes of `cedar serve` (api_routes.h): every endpoint, rate limits and streaming, on the
// transport's handler threads, and the replies to the transport's refusals.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <variant>

#include "core/log.h"
#include "serve/api/anthropic_schema.h"
#include "serve/api/api_routes.h"
#include "serve/api/openai_schema.h"
#include "serve/api/responses_schema.h"
#include "serve/http/sse.h"

namespace cedar::serve {
namespace http = boost::beast::http;
using Api = ApiRoutes::Api;
namespace {


std::unique_ptr<StreamSink> make_stream_sink(Api api, bool include_usage) {
  switch (api) {
    case Api::kChatCompletions: return std::make_unique<ChatCompletionStream>(include_usage);
    case Api::kCompletions: return std::make_unique<TextCompletionStream>(include_usage);
    case Api::kResponses: return std::make_unique<ResponsesStream>();
    case Api::kMessages: return std::make_unique<MessagesStream>();
  }
  return nullptr;
}

std::string render_turn(Api api, const Completion& turn) {
  switch (api) {
    case Api::kChatCompletions: return render_chat_completion(turn);
    case Api::kCompletions: return render_text_completion(turn);
    case Api::kResponses: return render_response(turn);
    case Api::kMessages: return render_message(turn);
  }
  return "";
}

// OpenAI's x-ratelimit-*-tokens headers: the limit, what is left, and when the bucket is full
// again ("1.5s").
void add_rate_limit_headers(const TokenBudget::Decision& budget, Reply* r) {
  char reset[32];
  std::snprintf(reset, sizeof reset, "%.3gs", budget.reset_seconds);
  r->headers.emplace_back("x-ratelimit-limit-tokens", std::to_string(budget.limit));
  r->headers.emplace_back("x-ratelimit-remaining-tokens", std::to_string(budget.remaining));
  r->headers.emplace_back("x-ratelimit-reset-tokens", reset);
}

}  // namespace

Endpoint endpoint_of_path(std::string_view path) {
  if (path == "/v1/chat/completions") return Endpoint::kChatCompletions;
  if (path == "/v1/completions") return Endpoint::kCompletions;
  if (path == "/v1/responses") return Endpoint::kResponses;
  if (is_anthropic_path(path)) return Endpoint::kMessages;
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) return Endpoint::kModels;
  if (path == "/health") return Endpoint::kHealth;
  if (path == "/metrics") return Endpoint::kMetrics;
  return Endpoint::kOther;
}

Reply error_reply(bool anthropic, const ApiError& error) {
  Reply r;
  r.status = error.http_status();
  r.body = anthropic ? render_anthropic_error(error) : render_openai_error(error);
  return r;
}

Endpoint ApiRoutes::endpoint_of(Api api) {
  switch (api) {
    case Api::kChatCompletions: return Endpoint::kChatCompletions;
    case Api::kCompletions: return Endpoint::kCompletions;
    case Api::kResponses: return Endpoint::kResponses;
    case Api::kMessages: return Endpoint::kMessages;
  }
  return Endpoint::kOther;
}

Reply ApiRoutes::refusal(const Refusal& refusal) {
  ErrorKind kind = ErrorKind::kInvalidRequest;
  switch (refusal.kind) {
    case Refusal::Kind::kMalformed: kind = ErrorKind::kInvalidRequest; break;
    case Refusal::Kind::kUnauthenticated: kind = ErrorKind::kAuthentication; break;
    case Refusal::Kind::kForbidden: kind = ErrorKind::kForbidden; break;
    case Refusal::Kind::kBodyTooLarge: kind = ErrorKind::kRequestTooLarge; break;
    case Refusal::Kind::kNotJson: kind = ErrorKind::kUnsupportedMediaType; break;
    case Refusal::Kind::kClientBusy: kind = ErrorKind::kRateLimited; break;
    case Refusal::Kind::kServerBusy: kind = ErrorKind::kOverloaded; break;
  }
  Reply r = error_reply(is_anthropic_path(refusal.path), {kind, refusal.message, ""});
  if (refusal.counts_as_response) metrics_.count_response(endpoint_of_path(refusal.path), r.status);
  return r;
}

void ApiRoutes::stopping() {
  std::lock_guard lock(live_mu_);
  stopped_ = true;
  for (const auto& stream : live_) stream->cancel();
}

void ApiRoutes::handle(ClientChannel& conn, const HttpRequest& req) {
  const std::string_view path = path_of(req.target());
  const bool keep_alive = req.keep_alive();
  bool streamed = false;
  Reply reply;
  try {
    const bool post = req.method() == http::verb::post;
    const bool get = req.method() == http::verb::get;
    if (post && path == "/v1/chat/completions") {
      reply = handle_generation(Api::kChatCompletions, req, conn, &streamed);
    } else if (post && path == "/v1/completions") {
      reply = handle_generation(Api::kCompletions, req, conn, &streamed);
    } else if (post && path == "/v1/responses") {
      reply = handle_generation(Api::kResponses, req, conn, &streamed);
    } else if (post && path == "/v1/messages") {
      reply = handle_generation(Api::kMessages, req, conn, &streamed);
    } else if (post && path == "/v1/messages/count_tokens") {
      reply = handle_count_tokens(req);
    } else if (get && path == "/v1/models") {
      reply.body = render_model_list({service_.config().model_id}, unix_seconds_now());
      metrics_.count_response(Endpoint::kModels, 200);
    } else if (get && path.size() > 11 && path.rfind("/v1/models/", 0) == 0) {
      const ModelLookup found =
          render_model_lookup({service_.config().model_id}, std::string(path.substr(11)), unix_seconds_now());
      reply.status = found.status;
      reply.body = found.body;
      metrics_.count_response(Endpoint::kModels, found.status);
    } else if (get && path == "/health") {
      const runtime::EngineStats es = engine_.stats();
      reply.body = render_health(service_.config().model_id, es.queue_depth, es.active_sequences);
      metrics_.count_response(Endpoint::kHealth, 200);
    } else if (get && path == "/metrics") {
      reply.content_type = "text/plain; version=0.0.4; charset=utf-8";
      reply.body = metrics_.render(engine_.stats());
      metrics_.count_response(Endpoint::kMetrics, 200);
    } else {
      reply = fail(endpoint_of_path(path), is_anthropic_path(path),
                   {ErrorKind::kNotFound, "no route for " + std::string(req.method_string()) + " " + std::string(path), ""});
    }
  } catch (const std::exception& e) {
    CEDAR_LOG_ERROR("serve: %s %s raised: %s", std::string(req.method_string()).c_str(), std::string(path).c_str(),
                    e.what());
    if (streamed) {
      conn.stream_close(false, false);
      return;
    }
    reply = fail(endpoint_of_path(path), is_anthropic_path(path),
                 {ErrorKind::kInternal, std::string("internal error: ") + e.what(), ""});
  }
  if (!streamed) conn.respond(std::move(reply), req.version(), keep_alive);
}

Reply ApiRoutes::handle_generation(Api api, const HttpRequest& req, ClientChannel& conn, bool* streamed) {
  const bool anthropic = api == Api::kMessages;
  auto failed = [&](const ApiError& error) { return fail(endpoint_of(api), anthropic, error); };
  OrderedJson body;
  if (SchemaError e = parse_body(req.body(), &body, [&conn] { return conn.gone(); })) return failed(*e);

  std::variant<PreparedGeneration, ApiError> prepared = ApiError{};
  StreamOptions stream_options;
  if (api == Api::kCompletions) {
    CompletionRequest request;
    if (SchemaError e = parse_completion_request(body, &request)) return failed(*e);
    stream_options = request.stream;
    prepared = service_.prepare_completion(request);
  } else {
    ChatRequest request;
    SchemaError e = api == Api::kChatCompletions ? parse_chat_completion_request(body, &request)
                    : api == Api::kResponses     ? parse_responses_request(body, &request)
                                                 : parse_messages_request(body, &request);
    if (e) return failed(*e);
    stream_options = request.stream;
    const char* id_prefix = api == Api::kChatCompletions ? "chatcmpl-" : api == Api::kResponses ? "resp_" : "msg_";
    prepared = service_.prepare_chat(request, id_prefix, anthropic ? "toolu_" : "call_");
  }
  if (const ApiError* e = std::get_if<ApiError>(&prepared)) return failed(*e);
  PreparedGeneration& generation = std::get<PreparedGeneration>(prepared);

  // The per-key slot is held for the whole generation (released on every return below).
  const auto authorization = req[http::field::authorization];
  const auto x_api_key = req["x-api-key"];
  const std::string bucket =
      key_.enabled() ? std::string(presented_key({authorization.data(), authorization.size()},
                                                {x_api_key.data(), x_api_key.size()}))
                    : std::string();
  if (!key_slots_.acquire(bucket)) {
    Reply r = fail(endpoint_of(api), anthropic,
                   {ErrorKind::kRateLimited,
                    "this API key already has " + std::to_string(key_slots_.limit()) +
                        " requests in flight (--max-concurrent-per-key); retry when one finishes",
                    ""});
    return r;
  }
  struct SlotRelease {
    KeySlots& slots;
    const std::string& bucket;
    ~SlotRelease() { slots.release(bucket); }
  } release{key_slots_, bucket};

  // The key's tokens per minute: the prompt and the whole output budget now; the output budget's
  // unused part is given back when the turn has ended (rate_limit.h).
  const int64_t output_budget = generation.request.sampling.max_tokens;
  const TokenBudget::Decision budget =
      token_budget_.admit(bucket, static_cast<int64_t>(generation.request.prompt_ids.size()), output_budget);
  if (!budget.admitted)
    return token_limit_reply(api, budget, generation.request.prompt_ids.size(), output_budget);
  struct OutputRefund {
    TokenBudget& budget;
    const std::string& bucket;
    int64_t unused;
    ~OutputRefund() { budget.refund(bucket, unused); }
  } refund{token_budget_, bucket, output_budget};
  auto charge_output = [&](const runtime::GenerationStream& done) {
    if (done.result().ok())
      refund.unused = std::max<int64_t>(0, output_budget - static_cast<int64_t>(done.result()->output_ids.size()));
  };

  // The constraint compiles here, after the key slot and the token rate limit (ChatService::submit).
  auto submitted = service_.submit(generation, [&conn] { return conn.gone(); });
  if (const ApiError* e = std::get_if<ApiError>(&submitted)) return failed(*e);
  std::shared_ptr<runtime::GenerationStream> task =
      std::get<std::shared_ptr<runtime::GenerationStream>>(std::move(submitted));
  // The client's departure (a reset the transport sees) cancels the generation at once; stop()
  // cancels every generation in flight.
  track(task, true);
  conn.when_gone([task] { task->cancel(); });
  struct Untrack {
    ApiRoutes& impl;
    ClientChannel& conn;
    const std::shared_ptr<runtime::GenerationStream>& task;
    ~Untrack() {
      conn.when_gone(nullptr);
      impl.track(task, false);
    }
  } untrack{*this, conn, task};

  if (stream_options.stream) {
    *streamed = true;
    stream(api, generation, *task, stream_options.include_usage, conn);
    charge_output(*task);
    conn.stream_close(!conn.gone(), req.keep_alive());
    return {};
  }
  // Non-streaming: the client gets nothing until the end, so its disconnect is learnt from the
  // socket (ClientChannel::when_gone above).
  auto outcome = service_.follow(generation, *task, nullptr, [&conn](bool) { return !conn.gone(); });
  charge_output(*task);
  if (const ApiError* e = std::get_if<ApiError>(&outcome)) return failed(*e);
  const Completion& turn = std::get<Completion>(outcome);
  metrics_.count_turn(turn.usage, conn.gone());
  Reply r;
  if (token_budget_.enabled()) add_rate_limit_headers(budget, &r);
  r.body = render_turn(api, turn);
  metrics_.count_response(endpoint_of(api), 200);
  return r;
}

void ApiRoutes::track(const std::shared_ptr<runtime::GenerationStream>& stream, bool add) {
  std::lock_guard lock(live_mu_);
  if (!add) {
    live_.erase(stream);
    return;
  }
  live_.insert(stream);
  if (stopped_) stream->cancel();
}

void ApiRoutes::stream(Api api, const PreparedGeneration& prepared, runtime::GenerationStream& task,
                              bool include_usage, ClientChannel& conn) {
  std::unique_ptr<StreamSink> sink = make_stream_sink(api, include_usage);
  metrics_.count_response(endpoint_of(api), 200);
  bool gone = !conn.stream_open(11);
  auto flush = [&](bool idle) {
    std::string bytes = sink->take();
    if (idle) bytes += sse_comment("keep-alive");
    if (!gone && !bytes.empty() && !conn.stream_write(std::move(bytes))) gone = true;
    if (conn.gone()) gone = true;
    return !gone;
  };
  auto outcome = service_.follow(prepared, task, sink.get(), flush);
  if (const Completion* turn = std::get_if<Completion>(&outcome)) metrics_.count_turn(turn->usage, gone);
}

Reply ApiRoutes::token_limit_reply(Api api, const TokenBudget::Decision& budget, size_t prompt_tokens,
                                          int64_t output_budget) {
  const std::string limit = std::to_string(budget.limit);
  const std::string cost = std::to_string(prompt_tokens) + " prompt tokens + " + std::to_string(output_budget) +
                           " output tokens (max_tokens)";
  std::string message =
      budget.never
          ? "this request needs " + cost + ", more than this API key's limit of " + limit +
                " tokens per minute (--max-tokens-per-minute-per-key); lower max_tokens or shorten the prompt"
          : "this API key has used its " + limit + " tokens per minute (--max-tokens-per-minute-per-key): " +
                std::to_string(budget.remaining) + " left, this request needs " + cost + "; retry in " +
                std::to_string(budget.retry_after_seconds) + " s";
  Reply r = error_reply(api == Api::kMessages, {ErrorKind::kTokenRateLimited, std::move(message), ""});
  if (!budget.never) r.headers.emplace_back("Retry-After", std::to_string(budget.retry_after_seconds));
  add_rate_limit_headers(budget, &r);
  metrics_.count_response(endpoint_of(api), r.status);
  return r;
}

Reply ApiRoutes::handle_count_tokens(const HttpRequest& req) {
  auto failed = [&](const ApiError& error) { return fail(Endpoint::kMessages, /*anthropic=*/true, error); };
  OrderedJson body;
  if (SchemaError e = parse_body(req.body(), &body)) return failed(*e);
  ChatRequest request;
  if (SchemaError e = parse_messages_request(body, &request, /*for_counting=*/true)) return failed(*e);
  auto prepared = service_.prepare_chat(request, "msg_", "toolu_");
  if (const ApiError* e = std::get_if<ApiError>(&prepared)) return failed(*e);
  Reply r;
  r.body = render_token_count(static_cast<int>(std::get<PreparedGeneration>(prepared).request.prompt_ids.size()));
  metrics_.count_response(Endpoint::kMessages, 200);
  return r;
}

}  // namespace cedar::serve
