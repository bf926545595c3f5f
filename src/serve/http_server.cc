#include "serve/http_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/log.h"
#include "serve/anthropic_schema.h"
#include "serve/auth.h"
#include "serve/body_budget.h"
#include "serve/metrics.h"
#include "serve/openai_schema.h"
#include "serve/rate_limit.h"
#include "serve/responses_schema.h"
#include "serve/sse.h"

namespace cedar::serve {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using Request = http::request<http::string_body>;
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

bool is_anthropic_path(std::string_view path) { return path.rfind("/v1/messages", 0) == 0; }

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

std::string_view to_std(beast::string_view s) { return {s.data(), s.size()}; }

// The request target without its query.
std::string_view path_of(beast::string_view target) {
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

// OpenAI's x-ratelimit-*-tokens headers: the limit, what is left, and when the bucket is full
// again ("1.5s").
void add_rate_limit_headers(const TokenBudget::Decision& budget, Reply* r) {
  char reset[32];
  std::snprintf(reset, sizeof reset, "%.3gs", budget.reset_seconds);
  r->headers.emplace_back("x-ratelimit-limit-tokens", std::to_string(budget.limit));
  r->headers.emplace_back("x-ratelimit-remaining-tokens", std::to_string(budget.remaining));
  r->headers.emplace_back("x-ratelimit-reset-tokens", reset);
}

Reply error_reply(bool anthropic, const ApiError& error) {
  Reply r;
  r.status = error.http_status();
  r.body = anthropic ? render_anthropic_error(error) : render_openai_error(error);
  return r;
}

// Fixed threads that run route handlers: generation follows its task to the end on one of them, so
// the I/O thread never waits for the engine.
class HandlerPool {
 public:
  explicit HandlerPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  ~HandlerPool() { shutdown(); }
  void post(std::function<void()> job) {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    jobs_.push_back(std::move(job));
    cv_.notify_one();
  }
  // Lets running jobs finish, drops queued ones, joins.
  void shutdown() {
    std::deque<std::function<void()>> dropped;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      dropped.swap(jobs_);
      cv_.notify_all();
    }
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (stopping_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

class HttpConnection;

struct HttpServer::Impl {
  Impl(runtime::Engine& engine_in, const tokenizer::Tokenizer& tokenizer, ServerOptions opts)
      : engine(engine_in),
        options(std::move(opts)),
        key(options.api_key),
        key_slots(options.max_concurrent_per_key),
        token_budget(options.max_tokens_per_minute_per_key),
        replay(options.replay_turns),
        queue(engine_in, options.queue),
        service(tokenizer, engine_in, queue, replay, options.service),
        pool(options.http_threads > 0 ? options.http_threads
                                      : options.queue.workers + options.queue.max_waiting + 8) {}

  // ---- I/O thread.
  void accept();
  // Counts a connection from `client` (its IP address); false when it already holds
  // max_connections_per_client. leave() undoes admit().
  bool admit_client(const std::string& client);
  void leave_client(const std::string& client);
  // Checks that need only the header: authentication, content type, Host/Origin. Runs before the
  // body is read, so a refused client cannot make the server buffer anything.
  std::optional<Reply> precheck(const http::request_parser<http::string_body>::value_type& header);

  // ---- Handler threads.
  void handle(const std::shared_ptr<HttpConnection>& conn, const Request& req);
  Reply handle_generation(Api api, const Request& req, HttpConnection& conn, bool* streamed);
  Reply handle_count_tokens(const Request& req);
  // 429 for a key whose tokens per minute are spent (or 429 without Retry-After for a prompt over
  // the whole budget), in the endpoint's error format.
  Reply token_limit_reply(Api api, const TokenBudget::Decision& budget, size_t prompt_tokens, int64_t output_budget);
  void stream(Api api, const PreparedGeneration& prepared, GenerationTask& task, bool include_usage,
              HttpConnection& conn);
  Reply fail(Endpoint endpoint, bool anthropic, const ApiError& error) {
    Reply r = error_reply(anthropic, error);
    if (error.kind == ErrorKind::kRateLimited)
      r.headers.emplace_back("Retry-After", std::to_string(service.retry_after_seconds()));
    metrics.count_response(endpoint, r.status);
    return r;
  }

  runtime::Engine& engine;
  const ServerOptions options;
  const ApiKeyCheck key;
  KeySlots key_slots;
  TokenBudget token_budget;
  ReplayStore replay;
  GenerationQueue queue;
  ChatService service;
  ServerMetrics metrics;
  std::atomic<int> connections{0};
  BodyBudget body_budget{options.max_body_bytes_in_flight};
  std::mutex clients_mu;
  std::unordered_map<std::string, size_t> client_connections;  // open connections per remote address
  std::atomic<bool> stopped{false};
  HandlerPool pool;
  // Declared after everything a connection touches: destroying the context destroys the
  // connections its pending handlers still hold.
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::thread serving;
};

// One client connection. Its I/O state is touched only on the I/O thread; the handler thread of
// the request being answered talks to it through respond()/stream_*(), which post to that thread,
// and reads gone().
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
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
  void reject_busy(const ApiError& error) {
    Reply r = error_reply(false, error);
    r.headers.emplace_back("Retry-After", "1");
    write_reply(std::move(r), 11, /*keep_alive=*/false);
  }

  // ---- Handler thread side.
  // True once the client is known to be gone (reset, failed write); the handler cancels then.
  bool gone() const { return gone_.load(std::memory_order_relaxed); }

  // Sends the handler's answer; the connection then goes on with the next request (or closes).
  void respond(Reply reply, unsigned version, bool keep_alive) {
    asio::post(server_.io, [self = shared_from_this(), reply = std::move(reply), version, keep_alive]() mutable {
      self->write_reply(std::move(reply), version, keep_alive);
    });
  }

  // A chunked text/event-stream response: the header, chunks, and the end. Each call waits until
  // its bytes are written (or the write failed / the server stops) and returns whether it worked.
  bool stream_open(unsigned version) {
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
  bool stream_write(std::string bytes) {
    return run_write([self = shared_from_this(), data = std::make_shared<std::string>(std::move(bytes))](
                         std::function<void(bool)> done) {
      self->arm_write_deadline();
      asio::async_write(self->socket_, http::make_chunk(asio::buffer(*data)),
                        [self, data, done](error_code ec, size_t) { self->write_done(ec, done); });
    });
  }
  // Ends the stream; `keep_alive` false (or a failed write) closes the connection.
  void stream_close(bool ok, bool keep_alive) {
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
    Request req = parser_->release();
    parser_.reset();
    dispatch(std::move(req));
  }

  // The body would take the server past --max-body-bytes-in-flight: 503 + Retry-After, and close
  // (the unread rest is drained, not stored).
  void refuse_body_budget() {
    deadline_.cancel();
    body_hold_.reset();
    const std::string_view path = path_of(parser_->get().target());
    ApiError error{ErrorKind::kOverloaded,
                   "this server already holds its limit of " + std::to_string(server_.body_budget.limit()) +
                       " bytes of request bodies in flight (--max-body-bytes-in-flight); retry shortly",
                   ""};
    Reply r = error_reply(is_anthropic_path(path), error);
    r.headers.emplace_back("Retry-After", "1");
    server_.metrics.count_response(endpoint_of_path(path), r.status);
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
    const bool anthropic = parser_->is_header_done() && is_anthropic_path(path_of(parser_->get().target()));
    const unsigned version = parser_->is_header_done() ? parser_->get().version() : 11;
    ApiError error;
    if (ec == http::error::body_limit) {
      error = {ErrorKind::kRequestTooLarge,
               "the request body is larger than this server's limit of " +
                   std::to_string(server_.options.max_body_bytes) + " bytes (--max-body-bytes)",
               ""};
    } else if (ec == http::error::buffer_overflow && parser_->is_header_done()) {
      error = invalid_request("a chunk-size line or the chunked trailer of the request body is larger than " +
                              std::to_string(kChunkLineLimit) + " bytes; send trailers (and chunk extensions) under that");
    } else if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      error = invalid_request("the request header is larger than " + std::to_string(kHeaderLimit) + " bytes");
    } else if (ec == http::error::partial_message) {
      return close_now();
    } else {
      error = invalid_request("the HTTP request was malformed: " + ec.message());
    }
    Reply r = error_reply(anthropic, error);
    server_.metrics.count_response(parser_->is_header_done() ? endpoint_of_path(path_of(parser_->get().target()))
                                                             : Endpoint::kOther,
                                   r.status);
    write_reply(std::move(r), version, /*keep_alive=*/false);
  }

  void dispatch(Request req) {
    busy_ = true;
    response_started_ = false;
    probing_ = false;
    version_ = req.version();
    watch();
    // The body's share of the budget goes with the request and is given back when its handler ends.
    server_.pool.post([self = shared_from_this(), req = std::move(req), hold = std::move(body_hold_)] {
      self->server_.handle(self, req);
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
      if (ec != asio::error::operation_aborted) gone_.store(true);
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
      gone_.store(true);
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
        self->gone_.store(true);
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
      gone_.store(true);
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
    if (!ok) gone_.store(true);
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
          ->reject_busy({ErrorKind::kOverloaded,
                         "this server already holds " + std::to_string(options.max_connections) +
                             " connections (--max-connections); retry later",
                         ""});
    } else if (!admit_client(client)) {
      std::make_shared<HttpConnection>(*this, std::move(socket), /*counted=*/false)
          ->reject_busy({ErrorKind::kRateLimited,
                         "this client address already holds " + std::to_string(options.max_connections_per_client) +
                             " connections (--max-connections-per-client); reuse or close some, then retry",
                         ""});
    } else {
      std::make_shared<HttpConnection>(*this, std::move(socket), /*counted=*/true, std::move(client))->start();
    }
    accept();
  });
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

std::optional<Reply> HttpServer::Impl::precheck(const http::request_parser<http::string_body>::value_type& header) {
  const std::string_view path = path_of(header.target());
  const bool anthropic = is_anthropic_path(path);
  auto refuse = [&](ErrorKind kind, std::string message) {
    Reply r = error_reply(anthropic, {kind, std::move(message), ""});
    metrics.count_response(endpoint_of_path(path), r.status);
    return r;
  };
  if (key.enabled()) {
    // Authentication before routing, so an unauthenticated client learns nothing about the routes.
    if (path == "/health") return std::nullopt;
    const auto authorization = header[http::field::authorization];
    const auto x_api_key = header["x-api-key"];
    if (key.accepts(presented_key({authorization.data(), authorization.size()}, {x_api_key.data(), x_api_key.size()})))
      return std::nullopt;
    return refuse(ErrorKind::kAuthentication,
                  "missing or invalid API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'");
  }
  if (options.allow_remote_origins) return std::nullopt;
  const auto host = header[http::field::host];
  if (!host.empty() && !is_loopback_authority({host.data(), host.size()}))
    return refuse(ErrorKind::kForbidden,
                  "Host '" + std::string(host) +
                      "' is not a loopback name; without an API key this server only answers requests for "
                      "localhost, 127.0.0.1 or [::1] (this blocks DNS rebinding). Set --api-key-file / "
                      "CEDAR_API_KEY, or start it with --allow-remote-origins");
  if (header.count(http::field::origin)) {
    const auto origin = header[http::field::origin];
    if (!is_loopback_origin({origin.data(), origin.size()}))
      return refuse(ErrorKind::kForbidden,
                    "Origin '" + std::string(origin) +
                        "' is not a loopback origin; without an API key this server refuses requests from other "
                        "web pages (this blocks cross-site requests). Set --api-key-file / CEDAR_API_KEY, or start "
                        "it with --allow-remote-origins");
  }
  if (header.method() == http::verb::post) {
    const auto type = header[http::field::content_type];
    if (!is_json_media_type({type.data(), type.size()}))
      return refuse(ErrorKind::kUnsupportedMediaType,
                    "POST bodies must be sent as 'Content-Type: application/json' (got '" + std::string(type) +
                        "'); without an API key other types are refused so that web pages cannot post here");
  }
  return std::nullopt;
}

void HttpServer::Impl::handle(const std::shared_ptr<HttpConnection>& conn, const Request& req) {
  const std::string_view path = path_of(req.target());
  const bool keep_alive = req.keep_alive();
  bool streamed = false;
  Reply reply;
  try {
    const bool post = req.method() == http::verb::post;
    const bool get = req.method() == http::verb::get;
    if (post && path == "/v1/chat/completions") {
      reply = handle_generation(Api::kChatCompletions, req, *conn, &streamed);
    } else if (post && path == "/v1/completions") {
      reply = handle_generation(Api::kCompletions, req, *conn, &streamed);
    } else if (post && path == "/v1/responses") {
      reply = handle_generation(Api::kResponses, req, *conn, &streamed);
    } else if (post && path == "/v1/messages") {
      reply = handle_generation(Api::kMessages, req, *conn, &streamed);
    } else if (post && path == "/v1/messages/count_tokens") {
      reply = handle_count_tokens(req);
    } else if (get && path == "/v1/models") {
      reply.body = render_model_list({service.config().model_id}, unix_seconds_now());
      metrics.count_response(Endpoint::kModels, 200);
    } else if (get && path.size() > 11 && path.rfind("/v1/models/", 0) == 0) {
      const ModelLookup found =
          render_model_lookup({service.config().model_id}, std::string(path.substr(11)), unix_seconds_now());
      reply.status = found.status;
      reply.body = found.body;
      metrics.count_response(Endpoint::kModels, found.status);
    } else if (get && path == "/health") {
      reply.body = render_health(service.config().model_id, queue.waiting(), queue.running());
      metrics.count_response(Endpoint::kHealth, 200);
    } else if (get && path == "/metrics") {
      reply.content_type = "text/plain; version=0.0.4; charset=utf-8";
      reply.body = metrics.render(engine.stats(), {queue.waiting(), queue.running()});
      metrics.count_response(Endpoint::kMetrics, 200);
    } else {
      reply = fail(endpoint_of_path(path), is_anthropic_path(path),
                   {ErrorKind::kNotFound, "no route for " + std::string(req.method_string()) + " " + std::string(path), ""});
    }
  } catch (const std::exception& e) {
    CEDAR_LOG_ERROR("serve: %s %s raised: %s", std::string(req.method_string()).c_str(), std::string(path).c_str(),
                    e.what());
    if (streamed) {
      conn->stream_close(false, false);
      return;
    }
    reply = fail(endpoint_of_path(path), is_anthropic_path(path),
                 {ErrorKind::kInternal, std::string("internal error: ") + e.what(), ""});
  }
  if (!streamed) conn->respond(std::move(reply), req.version(), keep_alive);
}

Reply HttpServer::Impl::handle_generation(Api api, const Request& req, HttpConnection& conn, bool* streamed) {
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
    prepared = service.prepare_completion(request);
  } else {
    ChatRequest request;
    SchemaError e = api == Api::kChatCompletions ? parse_chat_completion_request(body, &request)
                    : api == Api::kResponses     ? parse_responses_request(body, &request)
                                                 : parse_messages_request(body, &request);
    if (e) return failed(*e);
    stream_options = request.stream;
    const char* id_prefix = api == Api::kChatCompletions ? "chatcmpl-" : api == Api::kResponses ? "resp_" : "msg_";
    prepared = service.prepare_chat(request, id_prefix, anthropic ? "toolu_" : "call_");
  }
  if (const ApiError* e = std::get_if<ApiError>(&prepared)) return failed(*e);
  PreparedGeneration& generation = std::get<PreparedGeneration>(prepared);

  // The per-key slot is held for the whole generation (released on every return below).
  const auto authorization = req[http::field::authorization];
  const auto x_api_key = req["x-api-key"];
  const std::string bucket =
      key.enabled() ? std::string(presented_key({authorization.data(), authorization.size()},
                                                {x_api_key.data(), x_api_key.size()}))
                    : std::string();
  if (!key_slots.acquire(bucket)) {
    Reply r = fail(endpoint_of(api), anthropic,
                   {ErrorKind::kRateLimited,
                    "this API key already has " + std::to_string(key_slots.limit()) +
                        " requests in flight (--max-concurrent-per-key); retry when one finishes",
                    ""});
    return r;
  }
  struct SlotRelease {
    KeySlots& slots;
    const std::string& bucket;
    ~SlotRelease() { slots.release(bucket); }
  } release{key_slots, bucket};

  // The key's tokens per minute: the prompt and the whole output budget now; the output budget's
  // unused part is given back when the turn has ended (rate_limit.h).
  const int64_t output_budget = generation.request.sampling.max_tokens;
  const TokenBudget::Decision budget =
      token_budget.admit(bucket, static_cast<int64_t>(generation.request.prompt_ids.size()), output_budget);
  if (!budget.admitted)
    return token_limit_reply(api, budget, generation.request.prompt_ids.size(), output_budget);
  struct OutputRefund {
    TokenBudget& budget;
    const std::string& bucket;
    int64_t unused;
    ~OutputRefund() { budget.refund(bucket, unused); }
  } refund{token_budget, bucket, output_budget};
  auto charge_output = [&](const GenerationTask& done) {
    if (done.result().ok())
      refund.unused = std::max<int64_t>(0, output_budget - static_cast<int64_t>(done.result()->output_ids.size()));
  };

  // The constraint compiles here, after the key slot and the token rate limit (ChatService::submit).
  auto submitted = service.submit(generation, [&conn] { return conn.gone(); });
  if (const ApiError* e = std::get_if<ApiError>(&submitted)) return failed(*e);
  std::shared_ptr<GenerationTask> task = std::get<std::shared_ptr<GenerationTask>>(std::move(submitted));

  if (stream_options.stream) {
    *streamed = true;
    stream(api, generation, *task, stream_options.include_usage, conn);
    charge_output(*task);
    conn.stream_close(!conn.gone(), req.keep_alive());
    return {};
  }
  // Non-streaming: the client gets nothing until the end, so its disconnect is learnt from the
  // socket (HttpConnection::gone), checked whenever tokens arrive or the wait times out.
  auto outcome = service.follow(generation, *task, nullptr, [&conn](bool) { return !conn.gone(); });
  charge_output(*task);
  if (const ApiError* e = std::get_if<ApiError>(&outcome)) return failed(*e);
  const Completion& turn = std::get<Completion>(outcome);
  metrics.count_turn(turn.usage, conn.gone());
  Reply r;
  if (token_budget.enabled()) add_rate_limit_headers(budget, &r);
  r.body = render_turn(api, turn);
  metrics.count_response(endpoint_of(api), 200);
  return r;
}

void HttpServer::Impl::stream(Api api, const PreparedGeneration& prepared, GenerationTask& task, bool include_usage,
                              HttpConnection& conn) {
  std::unique_ptr<StreamSink> sink = make_stream_sink(api, include_usage);
  metrics.count_response(endpoint_of(api), 200);
  bool gone = !conn.stream_open(11);
  auto flush = [&](bool idle) {
    std::string bytes = sink->take();
    if (idle) bytes += sse_comment("keep-alive");
    if (!gone && !bytes.empty() && !conn.stream_write(std::move(bytes))) gone = true;
    if (conn.gone()) gone = true;
    return !gone;
  };
  auto outcome = service.follow(prepared, task, sink.get(), flush);
  if (const Completion* turn = std::get_if<Completion>(&outcome)) metrics.count_turn(turn->usage, gone);
}

Reply HttpServer::Impl::token_limit_reply(Api api, const TokenBudget::Decision& budget, size_t prompt_tokens,
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
  metrics.count_response(endpoint_of(api), r.status);
  return r;
}

Reply HttpServer::Impl::handle_count_tokens(const Request& req) {
  auto failed = [&](const ApiError& error) { return fail(Endpoint::kMessages, /*anthropic=*/true, error); };
  OrderedJson body;
  if (SchemaError e = parse_body(req.body(), &body)) return failed(*e);
  ChatRequest request;
  if (SchemaError e = parse_messages_request(body, &request, /*for_counting=*/true)) return failed(*e);
  auto prepared = service.prepare_chat(request, "msg_", "toolu_");
  if (const ApiError* e = std::get_if<ApiError>(&prepared)) return failed(*e);
  Reply r;
  r.body = render_token_count(static_cast<int>(std::get<PreparedGeneration>(prepared).request.prompt_ids.size()));
  metrics.count_response(Endpoint::kMessages, 200);
  return r;
}

HttpServer::HttpServer(runtime::Engine& engine, const tokenizer::Tokenizer& tokenizer, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(options))) {}

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
  impl_->queue.shutdown();  // running generations end at their next token
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
