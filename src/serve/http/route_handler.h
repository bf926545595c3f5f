// What the HTTP transport (http_server.h) asks of the layer above it, and what it offers that layer.
// The transport reads requests, enforces the connection, header and body limits and the
// authentication and local-exposure checks, and writes replies and streams; the route handler
// (serve/api's ApiRoutes) decides what a request means. The transport knows no API: it names why it
// refused a request (a Refusal) and the handler renders that in the endpoint's error format.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace cedar::serve {

using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;

inline std::string_view to_std(boost::beast::string_view s) { return {s.data(), s.size()}; }

// The request target without its query.
inline std::string_view path_of(boost::beast::string_view target) {
  const std::string_view t = to_std(target);
  return t.substr(0, t.find('?'));
}

// What a route handler answers when it does not stream.
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// Why the transport answered a request itself, before (or instead of) a route handler.
struct Refusal {
  enum class Kind {
    kMalformed,        // 400: a request the HTTP parser rejected, or a header or chunk line too large
    kUnauthenticated,  // 401: missing or wrong API key
    kForbidden,        // 403: a non-loopback Host or Origin without an API key
    kBodyTooLarge,     // 413: a body over HttpOptions::max_body_bytes
    kNotJson,          // 415: a POST body that is not JSON without an API key
    kClientBusy,       // 429: the client address holds its share of connections
    kServerBusy,       // 503: the server holds its connections or body bytes in flight
  };
  Kind kind = Kind::kMalformed;
  std::string message;
  std::string_view path;           // the request's path; empty when its header was not read
  bool counts_as_response = true;  // false for a connection refused before any request was read
};

// What a route handler may do with its client's connection (HttpConnection implements it on the
// I/O thread; each call posts there).
class ClientChannel {
 public:
  virtual ~ClientChannel() = default;
  // True once the client is known to be gone (reset, failed write); the handler cancels then.
  virtual bool gone() const = 0;
  // Runs `on_gone` (on the I/O thread) when the client goes away, at once if it is gone already;
  // an empty function unregisters. How a generation learns of its client's departure without polling.
  virtual void when_gone(std::function<void()> on_gone) = 0;
  // Sends the handler's answer; the connection then goes on with the next request (or closes).
  virtual void respond(Reply reply, unsigned version, bool keep_alive) = 0;
  // A chunked text/event-stream response: the header, chunks, and the end. open and write wait
  // until their bytes are written (or the write failed / the server stops) and say whether it worked.
  virtual bool stream_open(unsigned version) = 0;
  virtual bool stream_write(std::string bytes) = 0;
  // Ends the stream; `keep_alive` false (or a failed write) closes the connection.
  virtual void stream_close(bool ok, bool keep_alive) = 0;
};

class RouteHandler {
 public:
  virtual ~RouteHandler() = default;
  // On a handler thread: answers `request` through `client` (respond, or stream_open ... stream_close).
  virtual void handle(ClientChannel& client, const HttpRequest& request) = 0;
  // On the I/O thread: the reply to a request the transport refused, in the endpoint's error format.
  virtual Reply refusal(const Refusal& refusal) = 0;
  // The server is stopping: end the work in flight (handlers then return soon) and refuse new work.
  virtual void stopping() = 0;
};

}  // namespace cedar::serve
