// Bounded load test over loopback: 16 clients stream concurrently (Chat Completions, Messages and
// Responses in turn) for CEDAR_SERVE_LOAD_SECONDS (default 4; the 2-minute run is
// CEDAR_SERVE_LOAD_SECONDS=120). Every stream must complete with the scripted answer, no request
// may fail, and the process's resident memory must stay bounded. A serial run (one client) gives
// the throughput baseline. It stops by itself: the clients stop starting requests at the deadline.
//
// The engine is the ScriptedEngine (a fixed per-token delay per sequence, no shared compute), so
// the concurrent/serial ratio measures the server's concurrency, not the model's batching.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using test::json;
using namespace std::chrono_literals;

double load_seconds() {
  const char* env = std::getenv("CEDAR_SERVE_LOAD_SECONDS");
  return env ? std::max(1.0, std::atof(env)) : 4.0;
}

// Resident set size of this process (the server runs in it), in KiB.
long rss_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

const std::string kAnswer = "The quick brown fox jumps over the lazy dog. 0123456789";

struct Tally {
  std::atomic<int> streams{0}, failures{0};
  std::atomic<long> tokens{0};
  std::string first_failure;
  std::atomic<bool> recorded{false};
  void fail(const std::string& why) {
    if (!recorded.exchange(true)) first_failure = why;
    ++failures;
  }
};

// One streamed request of the given API; checks it completed with the whole answer.
void stream_once(httplib::Client& client, int api, int n, Tally* tally) {
  const json user = {{"role", "user"}, {"content", "load " + std::to_string(n)}};
  json body;
  std::string path;
  if (api == 0) {
    path = "/v1/chat/completions";
    body = {{"messages", {user}}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  } else if (api == 1) {
    path = "/v1/messages";
    body = {{"max_tokens", 200}, {"messages", {user}}, {"stream", true}};
  } else {
    path = "/v1/responses";
    body = {{"input", "load " + std::to_string(n)}, {"stream", true}};
  }
  auto res = client.Post(path, body.dump(), "application/json");
  if (!res) return tally->fail(path + ": " + httplib::to_string(res.error()));
  if (res->status != 200) return tally->fail(path + ": status " + std::to_string(res->status) + " " + res->body);
  std::string text, last;
  int tokens = 0;
  for (const auto& e : test::parse_sse(res->body)) {
    last = e.event.empty() ? e.data : e.event;
    if (e.data == "[DONE]") continue;
    const json d = json::parse(e.data, nullptr, false);
    if (d.is_discarded()) return tally->fail("bad event " + e.data);
    if (api == 0 && !d["choices"].empty() && d["choices"][0]["delta"].contains("content"))
      text += d["choices"][0]["delta"]["content"].get<std::string>();
    if (api == 0 && d.contains("usage") && d["usage"].is_object()) tokens = d["usage"]["completion_tokens"];
    if (api == 1 && e.event == "content_block_delta") text += d["delta"]["text"].get<std::string>();
    if (api == 1 && e.event == "message_delta") tokens = d["usage"]["output_tokens"];
    if (api == 2 && e.event == "response.output_text.delta") text += d["delta"].get<std::string>();
    if (api == 2 && e.event == "response.completed") tokens = d["response"]["usage"]["output_tokens"];
  }
  const char* expected_last[] = {"[DONE]", "message_stop", "response.completed"};
  if (last != expected_last[api]) return tally->fail(path + ": stream ended with " + last);
  if (text != kAnswer) return tally->fail(path + ": text '" + text + "'");
  ++tally->streams;
  tally->tokens += tokens;
}

struct RunResult {
  int streams, failures;
  double tokens_per_second;
  std::string first_failure;
};

RunResult run(const test::TestServer& server, int clients, double seconds) {
  Tally tally;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto client = server.client(60);
      for (int n = 0; std::chrono::steady_clock::now() < deadline; ++n) stream_once(*client, (c + n) % 3, n, &tally);
    });
  }
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {tally.streams.load(), tally.failures.load(), tally.tokens.load() / elapsed, tally.first_failure};
}

TEST(Load, SixteenConcurrentStreamingClients) {
  ScriptedEngineOptions engine_options;
  engine_options.token_delay = 2ms;  // ~500 tokens/s per sequence, as a decode step would pace it
  engine_options.max_batch = 16;
  engine_options.max_queue = 16;
  auto engine = test::make_engine({{"", kAnswer + test::kEos}}, engine_options);
  ServerOptions options;
  options.max_waiting = 16;
  test::TestServer server(*engine, options);
  const double seconds = load_seconds();

  run(server, 16, std::min(1.0, seconds));  // warm up: thread pools, allocator arenas
  const long rss_before = rss_kib();
  const RunResult concurrent = run(server, 16, seconds);
  const long rss_after = rss_kib();
  const RunResult serial = run(server, 1, std::max(1.0, seconds / 4));

  std::printf(
      "load: 16 clients x %.0f s: %d streams, %d failures, %.0f tokens/s; 1 client: %d streams, %.0f tokens/s "
      "(x%.1f); RSS %ld -> %ld KiB\n",
      seconds, concurrent.streams, concurrent.failures, concurrent.tokens_per_second, serial.streams,
      serial.tokens_per_second, concurrent.tokens_per_second / std::max(serial.tokens_per_second, 1e-9), rss_before,
      rss_after);
  EXPECT_EQ(concurrent.failures, 0) << concurrent.first_failure;
  EXPECT_EQ(serial.failures, 0) << serial.first_failure;
  EXPECT_GE(concurrent.streams, 16);
  // Bounded memory: finished requests leave nothing behind but the engine's capped prefix store and
  // the replay store, so RSS may not grow with the number of requests served.
  EXPECT_LT(rss_after - rss_before, 64 * 1024) << "RSS grew by " << (rss_after - rss_before) << " KiB";
  auto health = server.client()->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(json::parse(health->body)["queue"]["running"], 0);
}

}  // namespace
}  // namespace cedar::serve
