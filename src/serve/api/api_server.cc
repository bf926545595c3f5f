// ApiServer (api_server.h): the routes of api_routes.cc on an HttpServer.
#include "serve/api/api_server.h"

#include "serve/api/api_routes.h"

namespace cedar::serve {
namespace {

// The handler threads: each follows one generation to its end, so by default as many as the engine
// runs and queues, plus 8 for the cheap endpoints.
HttpOptions transport_options(const runtime::Engine& engine, const ServerOptions& options) {
  HttpOptions http = options;
  if (http.http_threads <= 0) http.http_threads = engine.info().max_batch + options.max_waiting + 8;
  return http;
}

}  // namespace

ApiServer::ApiServer(runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer, ServerOptions options)
    : routes_(std::make_unique<ApiRoutes>(engine, tokenizer, options)),
      http_(std::make_unique<HttpServer>(*routes_, transport_options(engine, options))) {}

ApiServer::~ApiServer() { stop(); }

Result<int> ApiServer::bind() { return http_->bind(); }
Status ApiServer::serve() { return http_->serve(); }
Result<int> ApiServer::start() { return http_->start(); }
void ApiServer::stop() { http_->stop(); }
int ApiServer::open_connections() const { return http_->open_connections(); }
size_t ApiServer::body_bytes_in_flight() const { return http_->body_bytes_in_flight(); }

}  // namespace cedar::serve
