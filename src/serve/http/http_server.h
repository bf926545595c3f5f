// HttpServer: cedar's HTTP transport (Boost.Beast on one Asio I/O thread; route handlers run on a
// separate handler pool, never on the I/O thread), with the safety defaults of docs/SERVER.md:
// loopback binding unless told otherwise, an optional API key checked in constant time (without
// one: JSON bodies and loopback Host/Origin only), deadlines for a request's header and body, a body
// limit enforced while reading (chunked included), a server-wide budget of body bytes in flight, a
// connection cap overall and per client address. Keep-alive, pipelining and half-closed clients are
// served; a client that disconnects is reported to its handler (ClientChannel::when_gone).
// What the requests mean is the RouteHandler's business (serve/api's ApiServer routes the APIs).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "core/status.h"

namespace cedar::serve {

struct HttpOptions {
  std::string host = "127.0.0.1";  // loopback only unless the operator says otherwise
  int port = 8000;                 // 0: any free port (tests)
  std::string api_key;             // empty: no authentication (the local-exposure checks apply)
  bool allow_remote_origins = false;  // without a key: accept any Host/Origin and content type
  size_t max_body_bytes = 16u << 20;
  size_t max_connections = 2048;   // open connections; more are answered 503 and closed
  size_t max_connections_per_client = 256;  // open connections per remote IP address; more are
                                            // answered 429 and closed. 0 = no limit
  size_t max_body_bytes_in_flight = 256u << 20;  // request-body bytes held at once by all connections
                                                 // (read or being handled); a body that would pass
                                                 // it is answered 503 + Retry-After. 0 = no limit
  // Handler threads (each may follow one generation to its end); 0: ServerOptions (serve/api)
  // chooses the engine's max_batch + max_waiting + 8 for the cheap endpoints.
  int http_threads = 0;
  std::chrono::seconds header_timeout{30};  // a request's header (and a keep-alive wait) must arrive within this
  std::chrono::seconds body_timeout{120};   // and its body within this, however it trickles
  std::chrono::seconds io_timeout{60};      // one response write may take this long
};

class HttpConnection;  // http_server.cc: one client connection
class RouteHandler;    // route_handler.h: what the requests mean

class HttpServer {
 public:
  // `routes` answers the requests and outlives the server.
  HttpServer(RouteHandler& routes, HttpOptions options);
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
  // Tells the routes to stop (RouteHandler::stopping), stops accepting, and waits for open requests
  // to end. Safe from any thread; idempotent.
  void stop();

  int open_connections() const;  // tests: connections held now (rejected ones not counted)
  size_t body_bytes_in_flight() const;  // tests: request-body bytes reserved now

 private:
  friend class HttpConnection;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cedar::serve
