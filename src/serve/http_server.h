// HttpServer: cedar's HTTP front end (cpp-httplib). Routes
//   POST /v1/chat/completions   OpenAI Chat Completions (stream and non-stream)
//   POST /v1/completions        OpenAI legacy Completions (raw prompt)
//   POST /v1/responses          OpenAI Responses (stateless subset)
//   POST /v1/messages           Anthropic Messages
//   POST /v1/messages/count_tokens
//   GET  /v1/models, /health, /metrics
// onto the ChatService, with the safety defaults of docs/SERVER.md: loopback binding unless told
// otherwise, an optional API key checked in constant time, a request size limit, and an API-shaped
// JSON error for every failure (never a crash, never an HTML page).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"
#include "runtime/engine.h"
#include "serve/chat_service.h"
#include "serve/task_queue.h"
#include "tokenizer/tokenizer.h"

namespace cedar::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback only unless the operator says otherwise
  int port = 8000;                 // 0: any free port (tests)
  std::string api_key;             // empty: no authentication
  size_t max_body_bytes = 16u << 20;
  QueueLimits queue;
  ServiceConfig service;
  size_t replay_turns = 4096;      // ReplayStore capacity
  int http_threads = 0;            // 0: queue workers + max waiting + 8 for cheap endpoints
  std::chrono::seconds io_timeout{60};  // a client that sends or reads nothing this long is dropped
};

class HttpServer {
 public:
  HttpServer(runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer, ServerOptions options);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port (the chosen one when options.port is 0). An
  // address in use or not local to this machine is an IoError naming it.
  Result<int> bind();
  // Serves on the calling thread until stop() (after bind()).
  Status serve();
  // bind() + serve() on a background thread (tests); returns the port.
  Result<int> start();
  // Cancels queued and running generations, stops accepting, and waits for open requests to end.
  // Safe from any thread; idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cedar::serve
