// The inside of HttpServer, included by http_server.cc alone: the handler pool and the server's
// state. HttpConnection (http_server.cc) reads and writes one client connection on the I/O thread;
// the routes see it only as a ClientChannel (route_handler.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "serve/http/auth.h"
#include "serve/http/body_budget.h"
#include "serve/http/http_server.h"
#include "serve/http/route_handler.h"

namespace cedar::serve {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

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
  Impl(RouteHandler& routes_in, HttpOptions opts)
      : routes(routes_in), options(std::move(opts)), key(options.api_key), pool(std::max(1, options.http_threads)) {}

  void accept();
  // Counts a connection from `client` (its IP address); false when it already holds
  // max_connections_per_client. leave() undoes admit().
  bool admit_client(const std::string& client);
  void leave_client(const std::string& client);
  // Checks that need only the header: authentication, content type, Host/Origin. Runs before the
  // body is read, so a refused client cannot make the server buffer anything.
  std::optional<Reply> precheck(const http::request_parser<http::string_body>::value_type& header);

  RouteHandler& routes;
  const HttpOptions options;
  const ApiKeyCheck key;
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
