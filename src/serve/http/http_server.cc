// `cedar serve`'s transport (http_server_internal.h): accepting connections, checking and reading
// requests within their limits, writing replies and streams, on the one I/O thread.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <future>

#include "core/log.h"
#include "serve/http/http_server_internal.h"

namespace cedar::serve {
namespace {

using Clock = std::chrono::steady_clock;

// A request's header (request line + fields) may not exceed this; more is a 431-style 400.
constexpr size_t kHeaderLimit = 64u << 10;
// What the read buffer may hold beyond the body being parsed: pipelined requests waiting their turn.
constexpr size_t kReadBufferLimit = 1u << 20;
constexpr size_t kWatchReadSize = 16u << 10;
// While a body is read, what the read buffer may hold unparsed: the body's bytes are moved out as they
// are parsed, so only an incomplete chunk-size line or chunked trailer stays, and one over this is a
// 400 at once (rather than a wait for the body deadline).
constexpr size_t kChunkLineLimit = 64u << 10;
// After a final response on a connection that is closing, unread request bytes are drained (so the
// kernel does not answer them with a reset that could destroy the response before the client read
// it), for at most this long.
constexpr auto kDrainTimeout = std::chrono::seconds(3);
// How often a request whose client sent FIN is checked for a reset (see HttpConnection::watch).
constexpr auto kProbeInterval = std::chrono::milliseconds(50);

}  // namespace

// One client connection. Its I/O state is touched only on the I/O thread; the handler thread of
// the request being answered talks to it through respond()/stream_*(), which post to that thread,
// and reads gone().
class HttpConnection final : public ClientChannel, public std::enable_shared_from_this<HttpConnection> {
 public:
  // A counted connection was admitted for `client` (Impl::admit_client) and is let go when it ends.
  HttpConnection(HttpServer::Impl& server, tcp::socket socket, bool counted, std::string client = {})
      : server_(server), socket_(std::move(socket)), buffer_(kReadBufferLimit), deadline_(server.io),
        probe_timer_(server.io), counted_(counted), client_(std::move(client)) {
    if (counted_) server_.connections.fetch_add(1);
  }
  ~HttpConnection() {
    if (counted_) {
      server_.connections.fetch_sub(1);
      server_.leave_client(client_);
    }
  }

  void start() { read_request(); }

  // Over a connection cap: a 503 (the server's cap) or 429 (the client's own) without reading the
  // request, then close.
  void reject_busy(const Refusal& refusal) {
    Reply r = server_.routes.refusal(refusal);
    r.headers.emplace_back("Retry-After", "1");
    write_reply(std::move(r), 11, /*keep_alive=*/false);
  }

  // ---- Handler thread side.
  // True once the client is known to be gone (reset, failed write); the handler cancels then.
  bool gone() const override { return gone_.load(std::memory_order_relaxed); }

  void when_gone(std::function<void()> on_gone) override {
    std::unique_lock lock(gone_mu_);
    gone_listener_ = std::move(on_gone);
    if (gone() && gone_listener_) {
      std::function<void()> now = gone_listener_;
      lock.unlock();
      now();
    }
  }

  // Sends the handler's answer; the connection then goes on with the next request (or closes).
  void respond(Reply reply, unsigned version, bool keep_alive) override {
    asio::post(server_.io, [self = shared_from_this(), reply = std::move(reply), version, keep_alive]() mutable {
      self->write_reply(std::move(reply), version, keep_alive);
    });
  }

  // A chunked text/event-stream response: the header, chunks, and the end. Each call waits until
  // its bytes are written (or the write failed / the server stops) and returns whether it worked.
  bool stream_open(unsigned version) override {
    return run_write([self = shared_from_this(), version](std::function<void(bool)> done) {
      auto res = std::make_shared<http::response<http::empty_body>>(http::status::ok, version);
      res->set(http::field::content_type, "text/event-stream");
      res->set(http::field::cache_control, "no-cache");
      res->set("X-Accel-Buffering", "no");
      res->chunked(true);
      auto serializer = std::make_shared<http::response_serializer<http::empty_body>>(*res);
      self->response_started_ = true;
      self->arm_write_deadline();
      http::async_write_header(self->socket_, *serializer,
                               [self, res, serializer, done](error_code ec, size_t) { self->write_done(ec, done); });
    });
  }
  bool stream_write(std::string bytes) override {
    return run_write([self = shared_from_this(), data = std::make_shared<std::string>(std::move(bytes))](
                         std::function<void(bool)> done) {
      self->arm_write_deadline();
      asio::async_write(self->socket_, http::make_chunk(asio::buffer(*data)),
                        [self, data, done](error_code ec, size_t) { self->write_done(ec, done); });
    });
  }
  // Ends the stream; `keep_alive` false (or a failed write) closes the connection.
  void stream_close(bool ok, bool keep_alive) override {
    asio::post(server_.io, [self = shared_from_this(), ok, keep_alive] {
      if (!ok || !self->socket_.is_open()) return self->finish_exchange(false);
      self->arm_write_deadline();
      asio::async_write(self->socket_, http::make_chunk_last(), [self, keep_alive](error_code ec, size_t) {
        self->deadline_.cancel();
        self->finish_exchange(!ec && keep_alive);
      });
    });
  }

 private:
  // ---- Reading requests.
  void read_request() {
    if (server_.stopped.load()) return close_now();
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(server_.options.max_body_bytes);
    arm_read_deadline(server_.options.header_timeout);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(error_code ec) {
    if (ec) return on_read_error(ec);
    const auto& header = parser_->get();
    if (std::optional<Reply> refused = server_.precheck(header)) {
      return write_reply(std::move(*refused), header.version(), /*keep_alive=*/false);
    }
    // The server-wide body budget: a declared length is taken before any of the body is read (and
    // before a 100 Continue invites it); a chunked body's bytes as they arrive (on_body_part).
    body_hold_ = std::make_shared<BodyHold>(server_.body_budget);
    if (const auto length = parser_->content_length(); length && !body_hold_->grow_to(static_cast<size_t>(*length)))
      return refuse_body_budget();
    if (header.version() >= 11 && beast::iequals(header[http::field::expect], "100-continue") &&
        !parser_->is_done()) {
      auto interim = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      return http::async_write(socket_, *interim, [self = shared_from_this(), interim](error_code ec, size_t) {
        if (ec) return self->close_now();
        self->start_body();
      });
    }
    start_body();
  }

  void start_body() {
    arm_read_deadline(server_.options.body_timeout);
    buffer_.max_size(std::max(kChunkLineLimit, buffer_.size()));
    read_body_part();
  }

  void read_body_part() {
    if (parser_->is_done()) return on_body();
    http::async_read_some(socket_, buffer_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      if (ec) return self->on_read_error(ec);
      if (!self->body_hold_->grow_to(self->parser_->get().body().size())) return self->refuse_body_budget();
      self->read_body_part();
    });
  }

  void on_body() {
    deadline_.cancel();
    buffer_.max_size(kReadBufferLimit);
    HttpRequest req = parser_->release();
    parser_.reset();
    dispatch(std::move(req));
  }

  // The body would take the server past --max-body-bytes-in-flight: 503 + Retry-After, and close
  // (the unread rest is drained, not stored).
  void refuse_body_budget() {
    deadline_.cancel();
    body_hold_.reset();
    Reply r = server_.routes.refusal({Refusal::Kind::kServerBusy,
                                      "this server already holds its limit of " +
                                          std::to_string(server_.body_budget.limit()) +
                                          " bytes of request bodies in flight (--max-body-bytes-in-flight); retry shortly",
                                      path_of(parser_->get().target())});
    r.headers.emplace_back("Retry-After", "1");
    const unsigned version = parser_->get().version();
    parser_.reset();  // what was read of the body goes now, not after the drain
    write_reply(std::move(r), version, /*keep_alive=*/false);
  }

  void on_read_error(error_code ec) {
    deadline_.cancel();
    body_hold_.reset();
    const bool mid_request = parser_ && parser_->got_some();
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::operation_aborted ||
        !socket_.is_open() || (!mid_request && ec != http::error::body_limit)) {
      return close_now();  // the client left (or timed out) between requests, or mid-way
    }
    const unsigned version = parser_->is_header_done() ? parser_->get().version() : 11;
    Refusal refusal;
    refusal.path = parser_->is_header_done() ? path_of(parser_->get().target()) : std::string_view();
    if (ec == http::error::body_limit) {
      refusal.kind = Refusal::Kind::kBodyTooLarge;
      refusal.message = "the request body is larger than this server's limit of " +
                        std::to_string(server_.options.max_body_bytes) + " bytes (--max-body-bytes)";
    } else if (ec == http::error::buffer_overflow && parser_->is_header_done()) {
      refusal.message = "a chunk-size line or the chunked trailer of the request body is larger than " +
                        std::to_string(kChunkLineLimit) + " bytes; send trailers (and chunk extensions) under that";
    } else if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      refusal.message = "the request header is larger than " + std::to_string(kHeaderLimit) + " bytes";
    } else if (ec == http::error::partial_message) {
      return close_now();
    } else {
      refusal.message = "the HTTP request was malformed: " + ec.message();
    }
    Reply r = server_.routes.refusal(refusal);
    write_reply(std::move(r), version, /*keep_alive=*/false);
  }

  void dispatch(HttpRequest req) {
    busy_ = true;
    response_started_ = false;
    probing_ = false;
    version_ = req.version();
    watch();
    // The body's share of the budget goes with the request and is given back when its handler ends.
    server_.pool.post([self = shared_from_this(), req = std::move(req), hold = std::move(body_hold_)] {
      self->server_.routes.handle(*self, req);
    });
  }

  // While a handler runs, keep reading: pipelined requests go to the buffer (bounded), and the end
  // of the stream is noticed. A FIN alone does not mean the client is gone: a half-closed client
  // (shutdown(SHUT_WR) after sending) still waits for its answer. A client that closed its socket
  // entirely answers the next bytes we send with a reset, so an HTTP/1.1 client that sent FIN gets
  // one "100 Continue" interim response (which RFC 9110 requires clients to accept and skip), and
  // the socket is then polled for the reset.
  //
  // The watch waits for readiness and reads with recv() itself rather than with an Asio read: an
  // Asio read would have to be cancelled when the response is done, and Asio's reactor stops
  // reading speculatively after a read that returned end-of-stream (it then waits for an epoll
  // edge that never comes), which would leave the next request read hanging.
  void watch() {
    if (watching_ || peer_eof_ || !socket_.is_open()) return;
    if (!pull_available()) return;
    watching_ = true;
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) { self->on_watch(ec); });
  }

  void on_watch(error_code ec) {
    watching_ = false;
    if (after_watch_) {
      auto next = std::exchange(after_watch_, nullptr);
      return next();
    }
    if (ec) {
      if (ec != asio::error::operation_aborted) mark_gone();
      return;
    }
    if (busy_) watch();
  }

  // Moves what the kernel holds now into the buffer. False when the client sent FIN, the socket
  // failed, or the buffer is full (then the bytes wait in the kernel until the next request read).
  bool pull_available() {
    for (;;) {
      if (buffer_.size() + kWatchReadSize > buffer_.max_size()) return false;
      auto space = buffer_.prepare(kWatchReadSize);
      const ssize_t n = ::recv(socket_.native_handle(), space.data(), space.size(), MSG_DONTWAIT);
      if (n > 0) {
        buffer_.commit(static_cast<size_t>(n));
        continue;
      }
      if (n == 0) {
        peer_eof_ = true;
        if (busy_ && !response_started_ && version_ >= 11) probe();
        return false;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      mark_gone();
      return false;
    }
  }

  void probe() {
    if (probing_) return;
    probing_ = true;
    auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
    writing_ = true;
    asio::async_write(socket_, asio::buffer(*interim), [self = shared_from_this(), interim](error_code ec, size_t) {
      self->writing_ = false;
      if (ec) {
        self->mark_gone();
      } else {
        self->poll_for_reset();
      }
      if (self->after_write_) std::exchange(self->after_write_, nullptr)();
    });
  }

  void poll_for_reset() {
    if (!busy_ || response_started_ || !socket_.is_open()) return;
    pollfd p{socket_.native_handle(), 0, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR))) {
      mark_gone();
      return;
    }
    probe_timer_.expires_after(kProbeInterval);
    probe_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec) self->poll_for_reset();
    });
  }

  // ---- Writing.
  void write_reply(Reply reply, unsigned version, bool keep_alive) {
    if (writing_) {  // the interim probe is still on the wire
      after_write_ = [self = shared_from_this(), reply = std::move(reply), version, keep_alive]() mutable {
        self->write_reply(std::move(reply), version, keep_alive);
      };
      return;
    }
    if (!socket_.is_open()) return finish_exchange(false);
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(reply.status),
                                                                   version ? version : 11);
    res->set(http::field::content_type, reply.content_type);
    for (auto& [name, value] : reply.headers) res->set(name, value);
    res->body() = std::move(reply.body);
    res->keep_alive(keep_alive && !server_.stopped.load());
    res->prepare_payload();
    response_started_ = true;
    arm_write_deadline();
    http::async_write(socket_, *res, [self = shared_from_this(), res](error_code ec, size_t) {
      self->deadline_.cancel();
      self->finish_exchange(!ec && res->keep_alive());
    });
  }

  // Runs `start` on the I/O thread (it starts one write and calls done(ok)) and waits for it.
  bool run_write(std::function<void(std::function<void(bool)>)> start) {
    auto result = std::make_shared<std::promise<bool>>();
    std::future<bool> written = result->get_future();
    asio::post(server_.io, [self = shared_from_this(), start = std::move(start), result]() {
      auto done = [result](bool ok) { result->set_value(ok); };
      if (!self->socket_.is_open() || self->gone()) return done(false);
      if (self->writing_) {
        self->after_write_ = [self, start, done] { start(done); };
        return;
      }
      start(done);
    });
    // The write deadline ends a stuck write; this only guards a stopping server whose I/O thread
    // no longer runs posted work.
    while (written.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready) {
      if (server_.stopped.load()) return false;
    }
    const bool ok = written.get();
    if (!ok) mark_gone();
    return ok;
  }

  void write_done(error_code ec, const std::function<void(bool)>& done) {
    deadline_.cancel();
    done(!ec);
  }

  // After a final response: the next request, or a graceful close.
  void finish_exchange(bool keep_alive) {
    busy_ = false;
    probing_ = false;
    probe_timer_.cancel();
    if (!keep_alive || gone() || server_.stopped.load()) return then_after_watch([self = shared_from_this()] {
        self->graceful_close();
      });
    then_after_watch([self = shared_from_this()] { self->read_request(); });
  }

  // Runs `next` once no watch read is outstanding (cancelling it), since only one read may run.
  void then_after_watch(std::function<void()> next) {
    if (!watching_) return next();
    after_watch_ = std::move(next);
    error_code ignored;
    socket_.cancel(ignored);
  }

  void graceful_close() {
    if (!socket_.is_open()) return;
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    arm_read_deadline(std::chrono::duration_cast<std::chrono::seconds>(kDrainTimeout));
    drain();
  }

  void drain() {
    auto scratch = std::make_shared<std::array<char, 16384>>();
    socket_.async_read_some(asio::buffer(*scratch), [self = shared_from_this(), scratch](error_code ec, size_t) {
      if (ec) return self->close_now();
      self->drain();
    });
  }

  void close_now() {
    deadline_.cancel();
    probe_timer_.cancel();
    error_code ignored;
    socket_.close(ignored);
  }

  // A deadline closes the socket, which fails the pending read or write.
  void arm_read_deadline(std::chrono::seconds limit) { arm_deadline(limit); }
  void arm_write_deadline() { arm_deadline(server_.options.io_timeout); }
  void arm_deadline(std::chrono::seconds limit) {
    deadline_.expires_after(limit);
    deadline_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->deadline_.expiry() > Clock::now()) return;
      error_code ignored;
      self->socket_.close(ignored);
    });
  }

  HttpServer::Impl& server_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  asio::steady_timer deadline_;
  asio::steady_timer probe_timer_;
  const bool counted_;
  const std::string client_;  // the remote IP address (counted connections)
  std::shared_ptr<BodyHold> body_hold_;  // the current request body's share of the budget
  unsigned version_ = 11;
  bool busy_ = false;              // a handler owns the current request
  bool response_started_ = false;  // bytes of the final response (or stream header) went out
  bool watching_ = false;
  bool peer_eof_ = false;
  bool probing_ = false;
  bool writing_ = false;           // the interim probe write is in flight
  std::function<void()> after_watch_;
  std::function<void()> after_write_;
  std::atomic<bool> gone_{false};
  std::mutex gone_mu_;
  std::function<void()> gone_listener_;  // ClientChannel::when_gone

  // The client is gone: say so to the handler's listener (it cancels the generation).
  void mark_gone() {
    if (gone_.exchange(true)) return;
    std::function<void()> listener;
    {
      std::lock_guard lock(gone_mu_);
      listener = gone_listener_;
    }
    if (listener) listener();
  }
};

void HttpServer::Impl::accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (stopped.load() || !acceptor.is_open()) return;
    if (ec) {
      // Out of file descriptors (or a transient accept failure): retry shortly instead of spinning;
      // the pending connections wait in the listen backlog.
      CEDAR_LOG_WARN("serve: accept failed: %s", ec.message().c_str());
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](error_code e) {
        if (!e) accept();
      });
      return;
    }
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);  // stream tokens as they come, not in Nagle batches
    const tcp::endpoint remote = socket.remote_endpoint(ignored);
    std::string client = remote.address().to_string();
    if (static_cast<size_t>(connections.load()) >= options.max_connections) {
      std::make_shared<HttpConnection>(*this, std::move(socket), /*counted=*/false)
          ->reject_busy({Refusal::Kind::kServerBusy,
                         "this server already holds " + std::to_string(options.max_connections) +
                             " connections (--max-connections); retry later",
                         {}, /*counts_as_response=*/false});
    } else if (!admit_client(client)) {
      std::make_shared<HttpConnection>(*this, std::move(socket), /*counted=*/false)
          ->reject_busy({Refusal::Kind::kClientBusy,
                         "this client address already holds " + std::to_string(options.max_connections_per_client) +
                             " connections (--max-connections-per-client); reuse or close some, then retry",
                         {}, /*counts_as_response=*/false});
    } else {
      std::make_shared<HttpConnection>(*this, std::move(socket), /*counted=*/true, std::move(client))->start();
    }
    accept();
  });
}

std::optional<Reply> HttpServer::Impl::precheck(const http::request_parser<http::string_body>::value_type& header) {
  const std::string_view path = path_of(header.target());
  auto refuse = [&](Refusal::Kind kind, std::string message) {
    return routes.refusal({kind, std::move(message), path});
  };
  if (key.enabled()) {
    // Authentication before routing, so an unauthenticated client learns nothing about the routes.
    if (path == "/health") return std::nullopt;
    const auto authorization = header[http::field::authorization];
    const auto x_api_key = header["x-api-key"];
    if (key.accepts(presented_key({authorization.data(), authorization.size()}, {x_api_key.data(), x_api_key.size()})))
      return std::nullopt;
    return refuse(Refusal::Kind::kUnauthenticated,
                  "missing or invalid API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'");
  }
  if (options.allow_remote_origins) return std::nullopt;
  const auto host = header[http::field::host];
  if (!host.empty() && !is_loopback_authority({host.data(), host.size()}))
    return refuse(Refusal::Kind::kForbidden,
                  "Host '" + std::string(host) +
                      "' is not a loopback name; without an API key this server only answers requests for "
                      "localhost, 127.0.0.1 or [::1] (this blocks DNS rebinding). Set --api-key-file / "
                      "CEDAR_API_KEY, or start it with --allow-remote-origins");
  if (header.count(http::field::origin)) {
    const auto origin = header[http::field::origin];
    if (!is_loopback_origin({origin.data(), origin.size()}))
      return refuse(Refusal::Kind::kForbidden,
                    "Origin '" + std::string(origin) +
                        "' is not a loopback origin; without an API key this server refuses requests from other "
                        "web pages (this blocks cross-site requests). Set --api-key-file / CEDAR_API_KEY, or start "
                        "it with --allow-remote-origins");
  }
  if (header.method() == http::verb::post) {
    const auto type = header[http::field::content_type];
    if (!is_json_media_type({type.data(), type.size()}))
      return refuse(Refusal::Kind::kNotJson,
                    "POST bodies must be sent as 'Content-Type: application/json' (got '" + std::string(type) +
                        "'); without an API key other types are refused so that web pages cannot post here");
  }
  return std::nullopt;
}

bool HttpServer::Impl::admit_client(const std::string& client) {
  std::lock_guard lock(clients_mu);
  size_t& open = client_connections[client];
  if (options.max_connections_per_client > 0 && open >= options.max_connections_per_client) {
    if (open == 0) client_connections.erase(client);
    return false;
  }
  ++open;
  return true;
}

void HttpServer::Impl::leave_client(const std::string& client) {
  std::lock_guard lock(clients_mu);
  auto it = client_connections.find(client);
  if (it != client_connections.end() && --it->second == 0) client_connections.erase(it);
}

HttpServer::HttpServer(RouteHandler& routes, HttpOptions options)
    : impl_(std::make_unique<Impl>(routes, std::move(options))) {}

HttpServer::~HttpServer() { stop(); }

Result<int> HttpServer::bind() {
  // A client that hangs up turns the next write into SIGPIPE, whose default action ends the process;
  // the server wants the failed write instead (it cancels that client's generation).
  signal(SIGPIPE, SIG_IGN);
  const std::string& host = impl_->options.host;
  error_code ec;
  const asio::ip::address address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec)
    return invalid_argument("--host '" + host +
                            "' is not a valid IP address; give one such as 127.0.0.1 (this machine only), ::1 or "
                            "0.0.0.0 (all interfaces)");
  const int port = impl_->options.port;
  const std::string where = host + ":" + std::to_string(port);
  tcp::acceptor& acceptor = impl_->acceptor;
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  acceptor.open(endpoint.protocol(), ec);
  if (ec) return io_error("cannot open a socket for " + where + ": " + ec.message(), ec.value());
  // SO_REUSEADDR only allows restarting over TIME_WAIT sockets; SO_REUSEPORT is left off, since it
  // would let another process of the same user bind the same port and take a share of the clients.
  acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  acceptor.bind(endpoint, ec);
  if (ec) {
    error_code ignored;
    acceptor.close(ignored);
    return io_error("cannot listen on " + where + ": " + ec.message() +
                        " (in use by another process, or not an address of this machine); choose --host/--port",
                    ec.value());
  }
  acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return io_error("cannot listen on " + where + ": " + ec.message(), ec.value());
  return static_cast<int>(acceptor.local_endpoint().port());
}

Status HttpServer::serve() {
  if (!impl_->acceptor.is_open()) return internal_error("HttpServer::serve() before a successful bind()");
  impl_->accept();
  for (;;) {
    try {
      impl_->io.run();
      break;
    } catch (const std::exception& e) {
      // A handler threw on the I/O thread: log it and keep serving the other connections.
      CEDAR_LOG_ERROR("serve: I/O handler raised: %s", e.what());
    }
  }
  return Status::ok_status();
}

Result<int> HttpServer::start() {
  CEDAR_ASSIGN_OR_RETURN(int port, bind());
  impl_->serving = std::thread([this] {
    Status st = serve();
    if (!st.ok()) CEDAR_LOG_ERROR("serve: %s", st.to_string().c_str());
  });
  return port;
}

void HttpServer::stop() {
  if (impl_->stopped.exchange(true)) return;
  // The routes end their work in flight (generations end at their engine's next step).
  impl_->routes.stopping();
  asio::post(impl_->io, [impl = impl_.get()] {
    error_code ignored;
    impl->acceptor.close(ignored);
    impl->accept_retry.cancel();
  });
  // Handlers finish (their writes fail fast once `stopped` is set), then the I/O thread stops.
  impl_->pool.shutdown();
  impl_->io.stop();
  if (impl_->serving.joinable()) impl_->serving.join();
}

int HttpServer::open_connections() const { return impl_->connections.load(); }

size_t HttpServer::body_bytes_in_flight() const { return impl_->body_budget.used(); }

}  // namespace cedar::serve
