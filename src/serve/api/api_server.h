// ApiServer: `cedar serve`'s front end, the three APIs on the HTTP transport of serve/http. Routes
//   POST /v1/chat/completions   OpenAI Chat Completions (stream and non-stream)
//   POST /v1/completions        OpenAI legacy Completions (raw prompt)
//   POST /v1/responses          OpenAI Responses (stateless subset)
//   POST /v1/messages           Anthropic Messages
//   POST /v1/messages/count_tokens
//   GET  /v1/models, /health, /metrics
// onto the ChatService (api_routes.cc), with per-key limits (rate_limit.h) and an API-shaped JSON
// error for every failure, the transport's refusals included (never a crash, never an HTML page).
// A client that disconnects cancels its generation, streaming or not. The transport's safety
// defaults (loopback binding, API key, deadlines, body and connection limits) are HttpOptions'.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/status.h"
#include "runtime/engine.h"
#include "serve/api/chat_service.h"
#include "serve/http/http_server.h"
#include "tokenizer/tokenizer.h"

namespace cedar::serve {

struct ServerOptions : HttpOptions {
  int max_concurrent_per_key = 0;             // generation requests in flight per API key (keyless clients
                                              // share one bucket); over it: 429. 0 = no limit
  int64_t max_tokens_per_minute_per_key = 0;  // prompt + generated tokens per key and minute
                                              // (rate_limit.h); over it: 429. 0 = no limit
  ServiceConfig service;
  size_t replay_turns = 4096;  // ReplayStore capacity
  int max_waiting = 64;        // the engine's queue (--queue); sizes the default http_threads
};

class ApiRoutes;  // api_routes.h

class ApiServer {
 public:
  ApiServer(runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer, ServerOptions options);
  ~ApiServer();  // stop()
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // HttpServer's: bind the listening socket (returns the port), serve on the calling thread until
  // stop(), or both on a background thread (tests).
  Result<int> bind();
  Status serve();
  Result<int> start();
  // Cancels queued and running generations, stops accepting, and waits for open requests to end.
  // Safe from any thread; idempotent.
  void stop();

  int open_connections() const;         // tests: connections held now (rejected ones not counted)
  size_t body_bytes_in_flight() const;  // tests: request-body bytes reserved now

 private:
  std::unique_ptr<ApiRoutes> routes_;
  std::unique_ptr<HttpServer> http_;  // declared after the routes it calls: destroyed first
};

}  // namespace cedar::serve
