// The HTTP layer against clients that misbehave on purpose (issue 12): slowloris connections,
// oversized and chunked bodies, pipelining, half-close, the connection cap, clients that leave in
// the middle of a generation, and the local-exposure defaults of a server without an API key.
// Every wait is bounded by a generous deadline; the assertions are on behaviour, never on timing.
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

#include "serve/http/auth.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using namespace std::chrono_literals;
using test::json;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Response = http::response<http::string_body>;

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

// Polls `condition` until it holds or `limit` passes (the limit only bounds the test).
bool eventually(const std::function<bool()>& condition, std::chrono::seconds limit = 30s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// Thousands of sockets need more descriptors than Debian's default soft limit of 1024.
bool raise_descriptor_limit(rlim_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return false;
  if (limit.rlim_cur >= wanted) return true;
  if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < wanted) return false;
  limit.rlim_cur = wanted;
  return setrlimit(RLIMIT_NOFILE, &limit) == 0;
}

// A raw client connection: bytes in, Beast-parsed responses out, every read under a deadline.
class RawClient {
 public:
  // `source`: the loopback address to connect from (127.0.0.2 is another client to the server).
  RawClient(asio::io_context& io, int port, const char* source = nullptr) : io_(io), socket_(io) {
    if (source) {
      socket_.open(tcp::v4());
      socket_.bind({asio::ip::make_address(source), 0});
    }
    socket_.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  }
  void send(std::string_view bytes) { asio::write(socket_, asio::buffer(bytes.data(), bytes.size())); }
  // For clients the server may already have dropped: false instead of an exception.
  bool try_send(std::string_view bytes) {
    boost::system::error_code ec;
    asio::write(socket_, asio::buffer(bytes.data(), bytes.size()), ec);
    return !ec;
  }
  void half_close() { socket_.shutdown(tcp::socket::shutdown_send); }
  void close() {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }
  int fd() { return socket_.native_handle(); }

  // The next final response (interim 1xx ones are skipped, as RFC 9110 requires of clients); nullopt
  // when the connection ends or nothing complete arrives within `limit`.
  std::optional<Response> read(std::chrono::seconds limit = 30s) {
    for (;;) {
      auto res = std::make_shared<Response>();
      std::optional<boost::system::error_code> result;
      http::async_read(socket_, buffer_, *res, [&](boost::system::error_code ec, size_t) { result = ec; });
      io_.restart();
      io_.run_for(limit);
      if (!result) {
        socket_.cancel();
        io_.restart();
        io_.run();
        return std::nullopt;
      }
      if (*result) return std::nullopt;
      if (res->result_int() >= 200) return std::move(*res);
    }
  }

  // True when the server closed the connection (EOF or reset) within `limit`.
  bool closed_by_server(std::chrono::seconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    char scratch[4096];
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd(), POLLIN, 0};
      if (::poll(&p, 1, 100) == 1) {
        const ssize_t n = ::recv(fd(), scratch, sizeof scratch, MSG_DONTWAIT);
        if (n <= 0) return true;
      }
    }
    return false;
  }

 private:
  asio::io_context& io_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
};

std::string get_request(const std::string& path, const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + "\r\n";
}

std::string post_request(const std::string& path, const std::string& body, const std::string& extra = "",
                         const std::string& content_type = "application/json") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra + "\r\n" + body;
}

class HostileClientTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}, ScriptedEngineOptions engine_options = {},
             const std::string& reply = "Hello there." + std::string(test::kEos)) {
    engine_ = test::make_engine({{"", reply}}, engine_options);
    options.host = "127.0.0.1";
    options.port = 0;
    options.service.model_id = "cedar-test";
    options.service.default_thinking = false;  // the reply is a chat-mode answer (as test::TestServer)
    server_ = std::make_unique<ApiServer>(*engine_, test::test_tokenizer(), options);
    auto port = server_->start();
    ASSERT_TRUE(port.ok()) << port.status().to_string();
    port_ = *port;
  }
  void TearDown() override {
    if (server_) server_->stop();
  }
  std::unique_ptr<RawClient> connect(const char* source = nullptr) {
    return std::make_unique<RawClient>(io_, port_, source);
  }
  std::string chat(bool stream) const {
    return json({{"messages", {user("go")}}, {"stream", stream}}).dump();
  }

  asio::io_context io_;
  std::unique_ptr<ScriptedEngine> engine_;
  std::unique_ptr<ApiServer> server_;
  int port_ = 0;
};

TEST_F(HostileClientTest, SlowlorisConnectionsDoNotStarveOtherClients) {
  constexpr int kSlow = 1000;
  ASSERT_TRUE(raise_descriptor_limit(2 * kSlow + 512)) << "cannot raise RLIMIT_NOFILE for " << kSlow << " sockets";
  ServerOptions options;
  options.header_timeout = 10s;  // long enough for a loaded machine to open them all first
  options.max_connections_per_client = 0;  // all of them come from 127.0.0.1 (the per-client cap has its test)
  start(options);
  std::vector<std::unique_ptr<RawClient>> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(connect());
    slow.back()->try_send("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
  }
  for (int round = 0; round < 2; ++round)  // trickle: one more byte each
    for (auto& c : slow) c->try_send("a");
  // A normal client is answered while all of them hold their connections open.
  auto normal = connect();
  normal->send(get_request("/health"));
  auto res = normal->read();
  ASSERT_TRUE(res.has_value()) << "the server did not answer a normal client behind " << kSlow << " slow ones";
  EXPECT_EQ(res->result_int(), 200);
  EXPECT_NE(res->body().find("cedar-test"), std::string::npos) << res->body();
  // The header deadline then ends every trickling connection.
  int closed = 0;
  for (auto& c : slow) closed += c->closed_by_server(30s) ? 1 : 0;
  EXPECT_EQ(closed, kSlow);
  EXPECT_TRUE(eventually([&] { return server_->open_connections() <= 1; })) << server_->open_connections();
}

TEST_F(HostileClientTest, OversizedChunkedBodyIs413WithBoundedMemory) {
  ServerOptions options;
  options.max_body_bytes = 16u << 20;
  start(options);
  auto client = connect();
  client->send(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n");
  const size_t baseline = resident_bytes();
  size_t peak = baseline;
  const std::string chunk_data(1u << 20, ' ');
  char size_line[32];
  std::snprintf(size_line, sizeof size_line, "%zx\r\n", chunk_data.size());
  const std::string chunk = size_line + chunk_data + "\r\n";
  // Up to 300 MB, stopping once the server answered (or refused to take more).
  size_t sent = 0;
  bool answered = false;
  while (sent < (300u << 20) && !answered) {
    size_t off = 0;
    while (off < chunk.size()) {
      pollfd p{client->fd(), POLLIN | POLLOUT, 0};
      if (::poll(&p, 1, 30'000) != 1) break;
      if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
        answered = true;
        break;
      }
      const ssize_t n = ::send(client->fd(), chunk.data() + off, chunk.size() - off, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n <= 0) {
        answered = true;
        break;
      }
      off += static_cast<size_t>(n);
    }
    sent += off;
    peak = std::max(peak, resident_bytes());
  }
  auto res = client->read();
  ASSERT_TRUE(res.has_value()) << "no answer after " << sent << " bytes";
  EXPECT_EQ(res->result_int(), 413) << res->body();
  EXPECT_NE(res->body().find("--max-body-bytes"), std::string::npos) << res->body();
  EXPECT_LT(sent, 300u << 20) << "the server read the whole 300 MB";
  EXPECT_LT(peak - baseline, 64u << 20) << "RSS grew by " << (peak - baseline) << " bytes";
  std::printf("[ figure ] chunked 413 after %zu bytes sent; RSS +%zu KiB over baseline\n", sent,
              (peak - baseline) >> 10);
}

TEST_F(HostileClientTest, DeclaredOversizedBodyIs413BeforeItIsSent) {
  ServerOptions options;
  options.max_body_bytes = 64u << 10;
  start(options);
  auto declared = connect();
  declared->send(
      "POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: 314572800\r\n\r\n");
  auto res = declared->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 413);
  EXPECT_NE(res->body().find("request_too_large"), std::string::npos) << res->body();  // Anthropic's shape

  auto sent = connect();
  sent->send(post_request("/v1/chat/completions", std::string(100u << 10, ' ')));
  res = sent->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 413);
}

TEST_F(HostileClientTest, PipelinedRequestsAreAnsweredInOrder) {
  start();
  auto client = connect();
  std::string pipeline;
  for (int i = 0; i < 21; ++i) pipeline += i % 3 == 0 ? get_request("/health") : get_request("/no-such-" + std::to_string(i));
  client->send(pipeline);
  for (int i = 0; i < 21; ++i) {
    auto res = client->read();
    ASSERT_TRUE(res.has_value()) << "reply " << i << " of 21 missing";
    if (i % 3 == 0) {
      EXPECT_EQ(res->result_int(), 200) << i;
    } else {
      EXPECT_EQ(res->result_int(), 404) << i;
      EXPECT_NE(res->body().find("/no-such-" + std::to_string(i) + "\""), std::string::npos)
          << "reply " << i << " out of order: " << res->body();
    }
  }
}

TEST_F(HostileClientTest, HalfClosedClientsAreAnswered) {
  ScriptedEngineOptions engine_options;
  engine_options.token_delay = 2ms;  // the generation outlives the client's FIN
  start({}, engine_options);
  auto pipelined = connect();
  std::string pipeline;
  for (int i = 0; i < 21; ++i) pipeline += get_request("/health");
  pipelined->send(pipeline);
  pipelined->half_close();
  for (int i = 0; i < 21; ++i) {
    auto res = pipelined->read();
    ASSERT_TRUE(res.has_value()) << "reply " << i << " of 21 missing after half-close";
    EXPECT_EQ(res->result_int(), 200);
  }
  // Then the server ends the connection too (the client said it will send nothing more).
  EXPECT_TRUE(pipelined->closed_by_server(30s));
  for (bool stream : {false, true}) {
    auto generation = connect();
    generation->send(post_request("/v1/chat/completions", chat(stream)));
    generation->half_close();
    auto res = generation->read();
    ASSERT_TRUE(res.has_value()) << "no answer to a half-closed " << (stream ? "streaming" : "plain") << " request";
    EXPECT_EQ(res->result_int(), 200);
    EXPECT_NE(res->body().find(stream ? "[DONE]" : "Hello there."), std::string::npos) << res->body();
  }
  EXPECT_EQ(engine_->stats().requests, 2u);
}

TEST_F(HostileClientTest, ConnectionCapAnswers503) {
  ServerOptions options;
  options.max_connections = 4;
  start(options);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 4; ++i) held.push_back(connect());
  ASSERT_TRUE(eventually([&] { return server_->open_connections() == 4; })) << server_->open_connections();
  auto refused = connect();
  refused->send(get_request("/health"));
  auto res = refused->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 503);
  EXPECT_NE(res->body().find("--max-connections"), std::string::npos) << res->body();
  held.pop_back();  // one leaves: room for a new client
  ASSERT_TRUE(eventually([&] { return server_->open_connections() < 4; }));
  auto admitted = connect();
  admitted->send(get_request("/health"));
  res = admitted->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 200);
}

// One client address may hold only --max-connections-per-client connections; another address still
// gets in (127.0.0.2 is a different client on loopback).
TEST_F(HostileClientTest, PerClientConnectionCapAnswers429AndLetsOtherClientsIn) {
  ServerOptions options;
  options.max_connections_per_client = 3;
  start(options);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 3; ++i) held.push_back(connect());
  ASSERT_TRUE(eventually([&] { return server_->open_connections() == 3; })) << server_->open_connections();
  auto refused = connect();
  refused->send(get_request("/health"));
  auto res = refused->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 429) << res->body();
  EXPECT_NE(res->body().find("--max-connections-per-client"), std::string::npos) << res->body();
  EXPECT_FALSE(res->keep_alive());
  auto other = connect("127.0.0.2");
  other->send(get_request("/health"));
  res = other->read();
  ASSERT_TRUE(res.has_value()) << "a second client address was not answered";
  EXPECT_EQ(res->result_int(), 200) << res->body();
  held[0]->send(get_request("/health"));  // the held ones are served as usual
  res = held[0]->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 200);
  held.pop_back();  // one leaves: room for a new connection from the first address
  ASSERT_TRUE(eventually([&] { return server_->open_connections() <= 3; }));
  auto admitted = connect();
  admitted->send(get_request("/health"));
  res = admitted->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 200);
}

// Half-sent bodies hold their declared length of --max-body-bytes-in-flight; the next one that would
// pass it is refused before it is read, and the server's memory stays bounded by the budget.
TEST_F(HostileClientTest, BodyBytesInFlightBudgetRefusesTheNextBodyWith503) {
  constexpr size_t kBody = 1u << 20, kBudget = 4 * kBody;
  ServerOptions options;
  options.max_body_bytes_in_flight = kBudget;
  start(options);
  const size_t baseline = resident_bytes();
  const std::string head =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: " + std::to_string(kBody) + "\r\n\r\n";
  const std::string half(kBody / 2, ' ');
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(connect());
    held.back()->send(head + half);
  }
  ASSERT_TRUE(eventually([&] { return server_->body_bytes_in_flight() == kBudget; }))
      << server_->body_bytes_in_flight();
  // Twenty more: each refused with 503 + Retry-After before its body is read.
  for (int i = 0; i < 20; ++i) {
    auto refused = connect();
    refused->send(head);
    auto res = refused->read();
    ASSERT_TRUE(res.has_value()) << "no answer to body " << i;
    EXPECT_EQ(res->result_int(), 503) << res->body();
    EXPECT_NE(res->body().find("--max-body-bytes-in-flight"), std::string::npos) << res->body();
    EXPECT_FALSE(res->operator[](http::field::retry_after).empty());
  }
  EXPECT_LE(server_->body_bytes_in_flight(), kBudget);
  const size_t grown = resident_bytes() - std::min(baseline, resident_bytes());
  EXPECT_LT(grown, 32u << 20) << "RSS grew by " << grown << " bytes";
  // A held body that completes is answered (a 400: spaces are not JSON), and gives its bytes back.
  held[0]->send(half);
  auto res = held[0]->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 400) << res->body();
  held.clear();  // the others leave: everything is given back, and a new body gets in
  ASSERT_TRUE(eventually([&] { return server_->body_bytes_in_flight() == 0; })) << server_->body_bytes_in_flight();
  auto admitted = connect();
  admitted->send(post_request("/v1/chat/completions", chat(false)));
  res = admitted->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 200) << res->body();
}

// A chunked body is charged as its chunks arrive: one that grows past the budget is refused mid-way.
TEST_F(HostileClientTest, ChunkedBodyPastTheBodyBudgetIs503) {
  ServerOptions options;
  options.max_body_bytes_in_flight = 256u << 10;
  start(options);
  auto client = connect();
  client->send(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n");
  const std::string chunk = "10000\r\n" + std::string(1u << 16, ' ') + "\r\n";  // 64 KiB
  for (int i = 0; i < 8 && client->try_send(chunk); ++i) {
  }
  auto res = client->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 503) << res->body();
  EXPECT_NE(res->body().find("--max-body-bytes-in-flight"), std::string::npos) << res->body();
  EXPECT_TRUE(eventually([&] { return server_->body_bytes_in_flight() == 0; })) << server_->body_bytes_in_flight();
}

// A chunked trailer (or chunk-size line) over 64 KiB is answered with a 400 as soon as it passes the
// limit, not after the body deadline (120 s by default; the read below waits at most 30 s).
TEST_F(HostileClientTest, OversizedChunkedTrailerIsAnswered400AtOnce) {
  start();
  for (const bool trailer : {true, false}) {
    auto client = connect();
    std::string request =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n";
    request += trailer ? "0\r\nX-Big: " + std::string(100u << 10, 'a')  // never ended by CRLF CRLF
                       : "1;ext=" + std::string(100u << 10, 'b');        // a chunk-size line never ended
    client->try_send(request);
    auto res = client->read();
    ASSERT_TRUE(res.has_value()) << (trailer ? "trailer" : "chunk line") << ": no answer";
    EXPECT_EQ(res->result_int(), 400) << res->body();
    EXPECT_NE(res->body().find("65536 bytes"), std::string::npos) << res->body();
  }
  auto normal = connect();  // a trailer under the limit is fine
  normal->send(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n" +
      [&] {
        const std::string body = chat(false);
        char size[16];
        std::snprintf(size, sizeof size, "%zx", body.size());
        return std::string(size) + "\r\n" + body + "\r\n0\r\nX-Small: " + std::string(1000, 'c') + "\r\n\r\n";
      }());
  auto res = normal->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 200) << res->body();
}

// Clients that leave mid-generation, all at once: the engine must see every request cancelled.
class DisconnectTest : public HostileClientTest, public ::testing::WithParamInterface<bool> {};

TEST_P(DisconnectTest, ClientsThatLeaveCancelTheirGenerations) {
  const bool stream = GetParam();
  constexpr int kClients = 16;  // the 16 abandoned requests
  ScriptedEngineOptions slow;
  slow.token_delay = 5ms;  // 2000 tokens: 10 s each if nobody stops them
  start({}, slow, std::string(2000, 'x') + test::kEos);
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(connect());
    clients.back()->send(post_request("/v1/chat/completions", chat(stream)));
  }
  ASSERT_TRUE(eventually([&] { return engine_->stats().active_sequences == kClients; }))
      << engine_->stats().active_sequences;
  if (stream) {  // a streaming client has seen its response begin
    char first[64];
    pollfd p{clients[0]->fd(), POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 30'000), 1);
    EXPECT_GT(::recv(clients[0]->fd(), first, sizeof first, 0), 0);
  }
  for (auto& c : clients) c->close();
  ASSERT_TRUE(eventually([&] { return engine_->stats().active_sequences == 0; }))
      << engine_->stats().active_sequences << " generations still running after their clients left";
  const runtime::EngineStats stats = engine_->stats();
  EXPECT_EQ(stats.requests, static_cast<uint64_t>(kClients));
  EXPECT_LT(stats.output_tokens, static_cast<uint64_t>(kClients) * 2000u) << "some generation ran to its end";
}

INSTANTIATE_TEST_SUITE_P(StreamingAndNot, DisconnectTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Streaming" : "NonStreaming"; });

TEST_F(HostileClientTest, WithoutAKeyOnlyLocalJsonRequestsAreServed) {
  start();
  const std::string body = chat(false);
  struct Case {
    std::string request;
    int status;
  };
  const std::vector<Case> cases = {
      {post_request("/v1/chat/completions", body, "", "text/plain"), 415},
      {post_request("/v1/chat/completions", body, "", "application/x-www-form-urlencoded"), 415},
      {"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body,
       415},
      {post_request("/v1/chat/completions", body, "", "application/json; charset=utf-8"), 200},
      {post_request("/v1/chat/completions", body, "Origin: http://evil.example\r\n"), 403},
      {post_request("/v1/chat/completions", body, "Origin: null\r\n"), 403},
      {post_request("/v1/chat/completions", body, "Origin: http://localhost:3000\r\n"), 200},
      {"GET /v1/models HTTP/1.1\r\nHost: rebound.evil.example:8000\r\n\r\n", 403},
      {"GET /v1/models HTTP/1.1\r\nHost: localhost:8000\r\n\r\n", 200},
      {"GET /v1/models HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n", 200},
  };
  for (const Case& c : cases) {
    auto client = connect();
    client->send(c.request);
    auto res = client->read();
    ASSERT_TRUE(res.has_value()) << c.request;
    EXPECT_EQ(res->result_int(), c.status) << c.request << "\n-> " << res->body();
    if (c.status == 403) {
      EXPECT_NE(res->body().find("--allow-remote-origins"), std::string::npos) << res->body();
    }
  }
}

TEST_F(HostileClientTest, AllowRemoteOriginsOpensItDeliberately) {
  ServerOptions options;
  options.allow_remote_origins = true;
  start(options);
  auto client = connect();
  client->send("GET /v1/models HTTP/1.1\r\nHost: my-server.lan:8000\r\nOrigin: http://app.lan\r\n\r\n");
  auto res = client->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 200);
}

TEST_F(HostileClientTest, PerKeyConcurrencyLimitAnswers429) {
  ServerOptions options;
  options.api_key = "k";
  options.max_concurrent_per_key = 1;
  ScriptedEngineOptions slow;
  slow.token_delay = 5ms;
  start(options, slow, std::string(2000, 'x') + test::kEos);
  auto first = connect();
  first->send(post_request("/v1/chat/completions", chat(false), "Authorization: Bearer k\r\n"));
  ASSERT_TRUE(eventually([&] { return engine_->stats().active_sequences == 1; }));
  auto second = connect();
  second->send(post_request("/v1/chat/completions", chat(false), "Authorization: Bearer k\r\n"));
  auto res = second->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 429);
  EXPECT_NE(res->body().find("--max-concurrent-per-key"), std::string::npos) << res->body();
  // With a key the local-exposure checks are the key's job: any Host and content type pass.
  auto other = connect();
  other->send("GET /v1/models HTTP/1.1\r\nHost: my-server.lan\r\nx-api-key: k\r\n\r\n");
  res = other->read();
  ASSERT_TRUE(res.has_value());
  EXPECT_EQ(res->result_int(), 200);
  first->close();
  EXPECT_TRUE(eventually([&] { return engine_->stats().active_sequences == 0; }));
}

TEST_F(HostileClientTest, HeaderDeadlineClosesAnIdleConnection) {
  ServerOptions options;
  options.header_timeout = 1s;
  start(options);
  auto idle = connect();
  EXPECT_TRUE(idle->closed_by_server(30s));
}

TEST_F(HostileClientTest, BodyDeadlineHoldsHoweverTheBodyTrickles) {
  ServerOptions options;
  options.body_timeout = 2s;
  start(options);
  auto trickle = connect();
  trickle->send("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                "Content-Length: 1000\r\n\r\n{");
  // One byte every 200 ms would take 200 s; each byte must not extend the deadline.
  bool closed = false;
  for (int i = 0; i < 150 && !closed; ++i) {
    closed = !trickle->try_send(" ") || trickle->closed_by_server(std::chrono::seconds(0));
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_TRUE(closed || trickle->closed_by_server(30s)) << "a trickled body outlived its deadline";
}

TEST(LocalExposureChecks, LoopbackAuthorityOriginAndJsonType) {
  for (const char* host : {"localhost", "LOCALHOST:8000", "127.0.0.1", "127.0.0.1:1", "[::1]", "[::1]:8000"})
    EXPECT_TRUE(is_loopback_authority(host)) << host;
  for (const char* host : {"", "evil.example", "localhost.evil.example", "127.0.0.1.nip.io", "127.0.0.1:80x",
                           "[::1]x", "10.0.0.1", "localhost:", "[::2]"})
    EXPECT_FALSE(is_loopback_authority(host)) << host;
  EXPECT_TRUE(is_loopback_origin("http://localhost:3000"));
  EXPECT_TRUE(is_loopback_origin("https://127.0.0.1"));
  EXPECT_FALSE(is_loopback_origin("null"));
  EXPECT_FALSE(is_loopback_origin("http://evil.example"));
  EXPECT_FALSE(is_loopback_origin("file://"));
  EXPECT_TRUE(is_json_media_type("application/json"));
  EXPECT_TRUE(is_json_media_type("Application/JSON; charset=utf-8"));
  EXPECT_FALSE(is_json_media_type("text/plain"));
  EXPECT_FALSE(is_json_media_type("application/jsonp"));
  EXPECT_FALSE(is_json_media_type(""));
}

}  // namespace
}  // namespace cedar::serve
