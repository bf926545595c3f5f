#include "serve/http_server.h"

#include <httplib.h>

#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>
#include <variant>

#include "core/log.h"
#include "serve/anthropic_schema.h"
#include "serve/auth.h"
#include "serve/metrics.h"
#include "serve/openai_schema.h"
#include "serve/responses_schema.h"
#include "serve/sse.h"

namespace cedar::serve {
namespace {

enum class Api { kChatCompletions, kCompletions, kResponses, kMessages };

Endpoint endpoint_of(Api api) {
  switch (api) {
    case Api::kChatCompletions: return Endpoint::kChatCompletions;
    case Api::kCompletions: return Endpoint::kCompletions;
    case Api::kResponses: return Endpoint::kResponses;
    case Api::kMessages: return Endpoint::kMessages;
  }
  return Endpoint::kOther;
}

bool is_anthropic_path(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

Endpoint endpoint_of_path(const std::string& path) {
  if (path == "/v1/chat/completions") return Endpoint::kChatCompletions;
  if (path == "/v1/completions") return Endpoint::kCompletions;
  if (path == "/v1/responses") return Endpoint::kResponses;
  if (is_anthropic_path(path)) return Endpoint::kMessages;
  if (path == "/v1/models" || path.rfind("/v1/models/", 0) == 0) return Endpoint::kModels;
  if (path == "/health") return Endpoint::kHealth;
  if (path == "/metrics") return Endpoint::kMetrics;
  return Endpoint::kOther;
}

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

// httplib::Server with access to its listening socket: Debian's 0.11.4 listens with a backlog of 5
// (a compile-time constant of the shared library), which drops connections of bursty clients
// before the server's own bounded queue could answer them; bind() raises it.
class HttplibServer : public httplib::Server {
 public:
  socket_t listening_socket() const { return svr_sock_; }
};

// What one streaming response keeps alive between the handler and httplib's content provider.
struct StreamState {
  PreparedGeneration prepared;
  std::shared_ptr<GenerationTask> task;
  std::unique_ptr<StreamSink> sink;
};

}  // namespace

struct HttpServer::Impl {
  Impl(runtime::Engine& engine_in, const tokenizer::Tokenizer& tokenizer, ServerOptions opts)
      : engine(engine_in),
        options(std::move(opts)),
        key(options.api_key),
        replay(options.replay_turns),
        queue(engine_in, options.queue),
        service(tokenizer, engine_in, queue, replay, options.service) {
    install();
  }

  void install();
  void send_error(httplib::Response& res, bool anthropic, const ApiError& error);
  void handle_generation(Api api, const httplib::Request& req, httplib::Response& res);
  void handle_count_tokens(const httplib::Request& req, httplib::Response& res);
  void stream(Api api, PreparedGeneration prepared, std::shared_ptr<GenerationTask> task, bool include_usage,
              httplib::Response& res);

  runtime::Engine& engine;
  const ServerOptions options;
  const ApiKeyCheck key;
  ReplayStore replay;
  GenerationQueue queue;
  ChatService service;
  ServerMetrics metrics;
  HttplibServer http;
  std::thread serving;
  std::atomic<bool> stopped{false};
};

void HttpServer::Impl::send_error(httplib::Response& res, bool anthropic, const ApiError& error) {
  res.status = error.http_status();
  res.set_content(anthropic ? render_anthropic_error(error) : render_openai_error(error), "application/json");
  if (error.kind == ErrorKind::kRateLimited) res.set_header("Retry-After", std::to_string(service.retry_after_seconds()));
}

void HttpServer::Impl::install() {
  const int threads =
      options.http_threads > 0 ? options.http_threads : options.queue.workers + options.queue.max_waiting + 8;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(options.max_body_bytes);
  http.set_read_timeout(options.io_timeout.count(), 0);
  http.set_write_timeout(options.io_timeout.count(), 0);
  http.set_keep_alive_max_count(1000);
  http.set_tcp_nodelay(true);  // stream tokens as they come, not in 40 ms Nagle batches
  // httplib's default sets SO_REUSEPORT, which lets any other process of the same user bind the same
  // port and take a share of the connections (and a second `cedar serve` on a busy port start
  // silently). SO_REUSEADDR alone only allows restarting over TIME_WAIT sockets.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });

  // Authentication before routing, so an unauthenticated client learns nothing about the routes.
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!key.enabled() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string authorization = req.get_header_value("Authorization");
    const std::string x_api_key = req.get_header_value("x-api-key");
    if (key.accepts(presented_key(authorization, x_api_key))) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, is_anthropic_path(req.path),
               {ErrorKind::kAuthentication,
                "missing or invalid API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'", ""});
    metrics.count_response(endpoint_of_path(req.path), res.status);
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own refusals (no route, body over the limit, bad request line) get a JSON body too.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError error{ErrorKind::kNotFound, "no route for " + req.method + " " + req.path, ""};
    if (res.status == 413) {
      error = {ErrorKind::kRequestTooLarge,
               "the request body is larger than this server's limit of " + std::to_string(options.max_body_bytes) +
                   " bytes (--max-body-bytes)",
               ""};
    } else if (res.status != 404) {
      error = {ErrorKind::kInvalidRequest,
               "the HTTP request was malformed (status " + std::to_string(res.status) + ")", ""};
    }
    const int status = res.status;
    send_error(res, is_anthropic_path(req.path), error);
    res.status = status;
    metrics.count_response(endpoint_of_path(req.path), status);
  });
  http.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    CEDAR_LOG_ERROR("serve: %s %s raised: %s", req.method.c_str(), req.path.c_str(), what.c_str());
    send_error(res, is_anthropic_path(req.path), {ErrorKind::kInternal, "internal error: " + what, ""});
    metrics.count_response(endpoint_of_path(req.path), res.status);
  });

  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(Api::kChatCompletions, req, res);
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(Api::kCompletions, req, res);
  });
  http.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(Api::kResponses, req, res);
  });
  http.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generation(Api::kMessages, req, res);
  });
  http.Post("/v1/messages/count_tokens",
            [this](const httplib::Request& req, httplib::Response& res) { handle_count_tokens(req, res); });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_model_list({service.config().model_id}, unix_seconds_now()), "application/json");
    metrics.count_response(Endpoint::kModels, 200);
  });
  http.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    const ModelLookup found = render_model_lookup({service.config().model_id}, req.matches[1], unix_seconds_now());
    res.status = found.status;
    res.set_content(found.body, "application/json");
    metrics.count_response(Endpoint::kModels, found.status);
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_health(service.config().model_id, queue.waiting(), queue.running()), "application/json");
    metrics.count_response(Endpoint::kHealth, 200);
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(engine.stats(), {queue.waiting(), queue.running()}),
                    "text/plain; version=0.0.4; charset=utf-8");
    metrics.count_response(Endpoint::kMetrics, 200);
  });
}

void HttpServer::Impl::handle_generation(Api api, const httplib::Request& req, httplib::Response& res) {
  const bool anthropic = api == Api::kMessages;
  auto fail = [&](const ApiError& error) {
    send_error(res, anthropic, error);
    metrics.count_response(endpoint_of(api), res.status);
  };
  OrderedJson body;
  if (SchemaError e = parse_body(req.body, &body)) return fail(*e);

  std::variant<PreparedGeneration, ApiError> prepared = ApiError{};
  StreamOptions stream;
  if (api == Api::kCompletions) {
    CompletionRequest request;
    if (SchemaError e = parse_completion_request(body, &request)) return fail(*e);
    stream = request.stream;
    prepared = service.prepare_completion(request);
  } else {
    ChatRequest request;
    SchemaError e = api == Api::kChatCompletions ? parse_chat_completion_request(body, &request)
                    : api == Api::kResponses     ? parse_responses_request(body, &request)
                                                 : parse_messages_request(body, &request);
    if (e) return fail(*e);
    stream = request.stream;
    const char* id_prefix = api == Api::kChatCompletions ? "chatcmpl-" : api == Api::kResponses ? "resp_" : "msg_";
    prepared = service.prepare_chat(request, id_prefix, anthropic ? "toolu_" : "call_");
  }
  if (const ApiError* e = std::get_if<ApiError>(&prepared)) return fail(*e);
  PreparedGeneration& generation = std::get<PreparedGeneration>(prepared);

  auto submitted = service.submit(generation);
  if (const ApiError* e = std::get_if<ApiError>(&submitted)) return fail(*e);
  std::shared_ptr<GenerationTask> task = std::get<std::shared_ptr<GenerationTask>>(std::move(submitted));

  if (stream.stream) return this->stream(api, std::move(generation), std::move(task), stream.include_usage, res);

  auto outcome = service.follow(generation, *task, nullptr, [](bool) { return true; });
  if (const ApiError* e = std::get_if<ApiError>(&outcome)) return fail(*e);
  const Completion& turn = std::get<Completion>(outcome);
  metrics.count_turn(turn.usage, false);
  res.set_content(render_turn(api, turn), "application/json");
  metrics.count_response(endpoint_of(api), 200);
}

void HttpServer::Impl::stream(Api api, PreparedGeneration prepared, std::shared_ptr<GenerationTask> task,
                              bool include_usage, httplib::Response& res) {
  auto state = std::make_shared<StreamState>();
  state->prepared = std::move(prepared);
  state->task = std::move(task);
  state->sink = make_stream_sink(api, include_usage);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  metrics.count_response(endpoint_of(api), 200);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, state](size_t /*offset*/, httplib::DataSink& out) {
        bool gone = false;
        auto flush = [&](bool idle) {
          std::string bytes = state->sink->take();
          if (idle) bytes += sse_comment("keep-alive");
          if (!gone && !bytes.empty() && !out.write(bytes.data(), bytes.size())) gone = true;
          return !gone;
        };
        auto outcome = service.follow(state->prepared, *state->task, state->sink.get(), flush);
        if (const Completion* turn = std::get_if<Completion>(&outcome)) metrics.count_turn(turn->usage, gone);
        if (gone) return false;  // httplib closes the connection
        out.done();
        return true;
      },
      // If httplib drops the response before the provider ran (the client left at once), stop the work.
      [state](bool success) {
        if (!success) state->task->cancel();
      });
}

void HttpServer::Impl::handle_count_tokens(const httplib::Request& req, httplib::Response& res) {
  auto fail = [&](const ApiError& error) {
    send_error(res, /*anthropic=*/true, error);
    metrics.count_response(Endpoint::kMessages, res.status);
  };
  OrderedJson body;
  if (SchemaError e = parse_body(req.body, &body)) return fail(*e);
  ChatRequest request;
  if (SchemaError e = parse_messages_request(body, &request, /*for_counting=*/true)) return fail(*e);
  auto prepared = service.prepare_chat(request, "msg_", "toolu_");
  if (const ApiError* e = std::get_if<ApiError>(&prepared)) return fail(*e);
  res.set_content(render_token_count(static_cast<int>(std::get<PreparedGeneration>(prepared).request.prompt_ids.size())),
                  "application/json");
  metrics.count_response(Endpoint::kMessages, 200);
}

HttpServer::HttpServer(runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(options))) {}

HttpServer::~HttpServer() { stop(); }

Result<int> HttpServer::bind() {
  // A client that hangs up turns the next write into SIGPIPE, whose default action ends the process;
  // the server wants the failed write instead (it cancels that client's generation).
  signal(SIGPIPE, SIG_IGN);
  const std::string& host = impl_->options.host;
  int port = impl_->options.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(host);
    if (port < 0) return io_error("cannot bind " + host + " on any port", errno);
  } else if (!impl_->http.bind_to_port(host, port)) {
    return io_error("cannot listen on " + host + ":" + std::to_string(port) +
                        " (in use by another process, or not an address of this machine); choose --host/--port",
                    errno);
  }
  // On Linux, listen() on a listening socket updates its backlog.
  if (::listen(impl_->http.listening_socket(), SOMAXCONN) != 0)
    return io_error("cannot raise the listen backlog of " + host + ":" + std::to_string(port), errno);
  return port;
}

Status HttpServer::serve() {
  if (!impl_->http.listen_after_bind() && !impl_->stopped.load())
    return io_error("the HTTP server stopped unexpectedly", errno);
  return Status::ok_status();
}

Result<int> HttpServer::start() {
  CEDAR_ASSIGN_OR_RETURN(int port, bind());
  impl_->serving = std::thread([this] {
    Status st = serve();
    if (!st.ok()) CEDAR_LOG_ERROR("serve: %s", st.to_string().c_str());
  });
  // Wait for the accept loop: stop() before it runs would be a no-op for httplib, and the loop would
  // then never end. Requests never wait on this (they queue in the listen backlog).
  for (int waited_ms = 0; !impl_->http.is_running(); ++waited_ms) {
    if (waited_ms > 10'000) return internal_error("the HTTP accept loop did not start within 10 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return port;
}

void HttpServer::stop() {
  if (impl_->stopped.exchange(true)) return;
  impl_->queue.shutdown();  // running streams end at their next token
  impl_->http.stop();
  if (impl_->serving.joinable()) impl_->serving.join();
}

}  // namespace cedar::serve
