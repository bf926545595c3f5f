// HttpServer: cedar's HTTP front end (Boost.Beast on one Asio I/O thread; route handlers and
// generation run on a separate handler pool, never on the I/O thread). Routes
//   POST /v1/chat/completions   OpenAI Chat Completions (stream and non-stream)
//   POST /v1/completions        OpenAI legacy Completions (raw prompt)
//   POST /v1/responses          OpenAI Responses (stateless subset)
//   POST /v1/messages           Anthropic Messages
//   POST /v1/messages/count_tokens
//   GET  /v1/models, /health, /metrics
// onto the ChatService, with the safety defaults of docs/SERVER.md: loopback binding unless told
// otherwise, an optional API key checked in constant time (without one: JSON bodies and loopback
// Host/Origin only), deadlines for a request's header and body, a body limit enforced while reading
// (chunked included), a server-wide budget of body bytes in flight, a connection cap overall and per
// client address, and an API-shaped JSON error for every failure (never a
// crash, never an HTML page). Keep-alive, pipelining and half-closed clients are served; a client
// that disconnects cancels its generation, streaming or not.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"
#include "runtime/engine.h"
#include "serve/chat_service.h"
#include "tokenizer/tokenizer.h"

namespace cedar::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback only unless the operator says otherwise
  int port = 8000;                 // 0: any free port (tests)
  std::string api_key;             // empty: no authentication (the local-exposure checks apply)
  bool allow_remote_origins = false;  // without a key: accept any Host/Origin and content type
  int max_concurrent_per_key = 0;  // generation requests in flight per API key (keyless clients
                                   // share one bucket); over it: 429. 0 = no limit
  int64_t max_tokens_per_minute_per_key = 0;  // prompt + generated tokens per key and minute
                                              // (rate_limit.h); over it: 429. 0 = no limit
  size_t max_body_bytes = 16u << 20;
  size_t max_connections = 2048;   // open connections; more are answered 503 and closed
  size_t max_connections_per_client = 256;  // open connections per remote IP address; more are
                                            // answered 429 and closed. 0 = no limit
  size_t max_body_bytes_in_flight = 256u << 20;  // request-body bytes held at once by all connections
                                                 // (read or being handled); a body that would pass
                                                 // it is answered 503 + Retry-After. 0 = no limit
  ServiceConfig service;
  size_t replay_turns = 4096;      // ReplayStore capacity
  // Handler threads (each follows one generation to its end); 0: the engine's max_batch +
  // max_waiting + 8 for the cheap endpoints. max_waiting is the engine's queue (--queue).
  int http_threads = 0;
  int max_waiting = 64;
  std::chrono::seconds header_timeout{30};  // a request's header (and a keep-alive wait) must arrive within this
  std::chrono::seconds body_timeout{120};   // and its body within this, however it trickles
  std::chrono::seconds io_timeout{60};      // one response write may take this long
};

class HttpConnection;  // http_server.cc: one client connection

class HttpServer {
 public:
  HttpServer(runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer, ServerOptions options);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port (the chosen one when options.port is 0). A host
  // that is not an IP address is InvalidArgument; an address in use or not local to this machine
  // is an IoError naming it.
  Result<int> bind();
  // Serves on the calling thread until stop() (after bind()).
  Status serve();
  // bind() + serve() on a background thread (tests); returns the port.
  Result<int> start();
  // Cancels queued and running generations, stops accepting, and waits for open requests to end.
  // Safe from any thread; idempotent.
  void stop();

  int open_connections() const;  // tests: connections held now (rejected ones not counted)
  size_t body_bytes_in_flight() const;  // tests: request-body bytes reserved now

 private:
  friend class HttpConnection;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cedar::serve
