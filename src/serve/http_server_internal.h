// The inside of HttpServer, shared by its two halves and included by nothing else:
//   http_server.cc  the transport: accepting, reading and writing connections on the I/O thread
//                   (HttpConnection), the connection caps and the body budget;
//   api_routes.cc   the routes, on the handler threads: the API endpoints, the header checks
//                   (precheck), rate limits, streaming.
// The routes see a connection only as a ClientChannel.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "serve/api_error.h"
#include "serve/auth.h"
#include "serve/body_budget.h"
#include "serve/chat_service.h"
#include "serve/http_server.h"
#include "serve/metrics.h"
#include "serve/rate_limit.h"
#include "serve/replay_store.h"

namespace cedar::serve {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using Request = http::request<http::string_body>;

enum class Api { kChatCompletions, kCompletions, kResponses, kMessages };

// What a route handler answers when it does not stream.
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

inline std::string_view to_std(beast::string_view s) { return {s.data(), s.size()}; }

// The request target without its query.
inline std::string_view path_of(beast::string_view target) {
  const std::string_view t = to_std(target);
  return t.substr(0, t.find('?'));
}

inline bool is_anthropic_path(std::string_view path) { return path.rfind("/v1/messages", 0) == 0; }

Endpoint endpoint_of_path(std::string_view path);
// The error body in the endpoint's format (Anthropic's or OpenAI's), with its status.
Reply error_reply(bool anthropic, const ApiError& error);

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

struct HttpServer::Impl {
  Impl(runtime::Engine& engine_in, const tokenizer::Tokenizer& tokenizer, ServerOptions opts)
      : engine(engine_in),
        options(std::move(opts)),
        key(options.api_key),
        key_slots(options.max_concurrent_per_key),
        token_budget(options.max_tokens_per_minute_per_key),
        replay(options.replay_turns),
        service(tokenizer, engine_in, replay, options.service),
        pool(options.http_threads > 0 ? options.http_threads : engine_in.info().max_batch + options.max_waiting + 8) {}

  // ---- I/O thread (http_server.cc; precheck in api_routes.cc).
  void accept();
  // Counts a connection from `client` (its IP address); false when it already holds
  // max_connections_per_client. leave() undoes admit().
  bool admit_client(const std::string& client);
  void leave_client(const std::string& client);
  // Checks that need only the header: authentication, content type, Host/Origin. Runs before the
  // body is read, so a refused client cannot make the server buffer anything.
  std::optional<Reply> precheck(const http::request_parser<http::string_body>::value_type& header);

  // ---- Handler threads (api_routes.cc).
  void handle(ClientChannel& conn, const Request& req);
  Reply handle_generation(Api api, const Request& req, ClientChannel& conn, bool* streamed);
  Reply handle_count_tokens(const Request& req);
  // 429 for a key whose tokens per minute are spent (or 429 without Retry-After for a prompt over
  // the whole budget), in the endpoint's error format.
  Reply token_limit_reply(Api api, const TokenBudget::Decision& budget, size_t prompt_tokens, int64_t output_budget);
  void stream(Api api, const PreparedGeneration& prepared, runtime::GenerationStream& generation,
              bool include_usage, ClientChannel& conn);
  // The generations in flight, so that stop() can end them; a handler registers its own.
  void track(const std::shared_ptr<runtime::GenerationStream>& stream, bool add);
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
  ChatService service;
  std::mutex live_mu;
  std::unordered_set<std::shared_ptr<runtime::GenerationStream>> live;  // generations in flight
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

}  // namespace cedar::serve
