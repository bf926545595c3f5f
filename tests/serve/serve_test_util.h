// Shared helpers for the serving tests (header-only: the suite compiles only *_test.cc): the test
// tokenizer, scripted engines, an in-process server on a free loopback port, and an SSE reader.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/api/api_server.h"
#include "serve/api/script_file.h"
#include "tokenizer/tokenizer.h"

namespace cedar::serve::test {

using json = nlohmann::ordered_json;

inline std::string data_dir() { return CEDAR_SOURCE_DIR "/tests/serve/data"; }
// The official V4.1 encoder's golden prompts and parses (tests/tokenizer/data/official/SOURCE.md).
inline std::string official_dir() { return CEDAR_SOURCE_DIR "/tests/tokenizer/data/official"; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "missing test file " << path;
    return {};
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// The byte-level test tokenizer with V4.1's markers as single tokens (data/make_test_tokenizer.py).
inline const tokenizer::Tokenizer& test_tokenizer() {
  static const std::unique_ptr<tokenizer::Tokenizer> tok = [] {
    auto r = tokenizer::Tokenizer::load_dir(data_dir() + "/tokenizer");
    if (!r.ok()) {
      std::fprintf(stderr, "cannot load the test tokenizer: %s\n", r.status().to_string().c_str());
      std::abort();
    }
    return std::move(*r);
  }();
  return *tok;
}

inline std::vector<int32_t> ids_of(const std::string& text) {
  auto ids = test_tokenizer().encode(text, /*add_special=*/false);
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

inline runtime::EngineInfo test_engine_info(int max_context = 65536) {
  runtime::EngineInfo info;
  info.model_id = "cedar-test";
  info.vocab_size = test_tokenizer().vocab_size();
  info.bos_id = 0;
  info.eos_id = 1;
  info.max_context = max_context;
  return info;
}

// A scripted engine over the test tokenizer; replies are {condition, completion text}.
inline std::unique_ptr<ScriptedEngine> make_engine(const std::vector<std::pair<std::string, std::string>>& replies,
                                                   ScriptedEngineOptions options = {}, int max_context = 65536) {
  std::vector<ScriptedReply> scripted;
  for (const auto& [when, text] : replies) scripted.push_back({when, ids_of(text)});
  return std::make_unique<ScriptedEngine>(std::move(scripted), test_engine_info(max_context), options,
                                          [](std::span<const int32_t> ids) {
                                            auto t = test_tokenizer().decode(ids, /*skip_special=*/false);
                                            return t.ok() ? *t : std::string();
                                          });
}

inline constexpr const char* kEos = "<｜end▁of▁sentence｜>";

// A server on a free loopback port for the lifetime of the object. The scripted completions of the
// server tests are chat-mode answers (no reasoning before `</think>`), so a TestServer runs as
// `cedar serve --thinking off` does; `server_default_thinking` keeps the server's own default
// (thinking, DeepSeek's) for the tests of that default.
class TestServer {
 public:
  explicit TestServer(runtime::Engine& engine, ServerOptions options = {}, bool server_default_thinking = false) {
    if (!server_default_thinking) options.service.default_thinking = false;
    options.host = "127.0.0.1";
    options.port = 0;
    if (options.service.model_id.empty()) options.service.model_id = "cedar-test";
    server_ = std::make_unique<ApiServer>(engine, test_tokenizer(), options);
    auto port = server_->start();
    if (!port.ok()) {
      ADD_FAILURE() << port.status().to_string();
      return;
    }
    port_ = *port;
  }
  ~TestServer() { server_->stop(); }
  int port() const { return port_; }
  std::unique_ptr<httplib::Client> client(int timeout_s = 30) const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_read_timeout(timeout_s, 0);
    c->set_write_timeout(timeout_s, 0);
    return c;
  }
  void stop() { server_->stop(); }

 private:
  std::unique_ptr<ApiServer> server_;
  int port_ = 0;
};

struct SseEvent {
  std::string event;  // empty for unnamed events
  std::string data;
};

// Splits an event-stream body into events (comments skipped), as the SDKs' decoders do.
inline std::vector<SseEvent> parse_sse(const std::string& body) {
  std::vector<SseEvent> events;
  SseEvent current;
  bool has_data = false;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) {
      if (has_data || !current.event.empty()) events.push_back(current);
      current = {};
      has_data = false;
    } else if (line[0] == ':') {
      continue;
    } else if (line.rfind("event: ", 0) == 0) {
      current.event = line.substr(7);
    } else if (line.rfind("data: ", 0) == 0) {
      if (has_data) current.data += "\n";
      current.data += line.substr(6);
      has_data = true;
    }
  }
  return events;
}

inline json post_json(httplib::Client& client, const std::string& path, const json& body, int* status = nullptr) {
  auto res = client.Post(path, body.dump(), "application/json");
  if (!res) {
    ADD_FAILURE() << "no response from " << path << ": " << httplib::to_string(res.error());
    return {};
  }
  if (status) *status = res->status;
  json parsed = json::parse(res->body, nullptr, false);
  EXPECT_FALSE(parsed.is_discarded()) << "not JSON: " << res->body;
  return parsed;
}

}  // namespace cedar::serve::test
