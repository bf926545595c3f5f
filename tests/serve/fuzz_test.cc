// Bounded fuzzing of request bodies: valid requests of every API, mutated at the byte level
// (flips, cuts, insertions) and at the JSON level (values swapped for other types, huge numbers,
// deep nesting, long strings, removed keys), go through the request path. Every answer must be a
// well-formed JSON success or API error (never a crash, never a 5xx for a client mistake), and
// the server must still serve afterwards.
//
// The mutation count is bounded (CEDAR_SERVE_FUZZ_ITERATIONS, default 1500 over HTTP plus 20000
// straight through the schemas) and the generator is seeded, so a failure reproduces.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "serve/api/anthropic_schema.h"
#include "serve/api/chat_service.h"
#include "serve/api/openai_schema.h"
#include "serve/api/responses_schema.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

using test::json;

int iterations(int fallback) {
  const char* env = std::getenv("CEDAR_SERVE_FUZZ_ITERATIONS");
  return env ? std::max(1, std::atoi(env)) : fallback;
}

struct Seed {
  const char* path;
  const char* body;
};

const Seed kSeeds[] = {
    {"/v1/chat/completions",
     R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]},
        {"role":"assistant","content":null,"reasoning_content":"r","tool_calls":[{"id":"c1","type":"function",
        "function":{"name":"f","arguments":"{\"a\": 1}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}],
        "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}}],
        "max_tokens":8,"temperature":0.7,"stop":["x"],"reasoning_effort":"low","stream":false})"},
    {"/v1/chat/completions",
     R"({"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},
        "response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object"}}}})"},
    {"/v1/completions", R"({"model":"m","prompt":"Once","max_tokens":5,"stop":"\n"})"},
    {"/v1/responses",
     R"({"model":"m","instructions":"i","input":[{"role":"user","content":"hi"},{"type":"reasoning","id":"r",
        "summary":[],"content":[{"type":"reasoning_text","text":"t"}]},{"type":"function_call","call_id":"c",
        "name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}],
        "tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"reasoning":{"effort":"high"},
        "max_output_tokens":8})"},
    {"/v1/messages",
     R"({"model":"m","max_tokens":8,"system":"s","messages":[{"role":"user","content":"hi"},{"role":"assistant",
        "content":[{"type":"thinking","thinking":"t","signature":"x"},{"type":"tool_use","id":"t1","name":"f",
        "input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}],
        "tools":[{"name":"f","input_schema":{"type":"object"}}],"thinking":{"type":"enabled","budget_tokens":1024},
        "stop_sequences":["z"],"stream":true})"},
};

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  std::string mutate(const std::string& body) {
    switch (pick(3)) {
      case 0: return mutate_bytes(body);
      default: {
        json j = json::parse(body);
        const int edits = 1 + pick(3);
        for (int i = 0; i < edits; ++i) mutate_tree(j, 0);
        return j.dump();
      }
    }
  }

 private:
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  std::string mutate_bytes(std::string s) {
    if (s.empty()) return s;
    switch (pick(4)) {
      case 0: s[pick(static_cast<int>(s.size()))] ^= static_cast<char>(1 << pick(8)); break;
      case 1: s.resize(pick(static_cast<int>(s.size()))); break;
      case 2: {
        const size_t at = pick(static_cast<int>(s.size()));
        s.erase(at, 1 + pick(16));
        break;
      }
      default: {
        static const char* kInserts[] = {"\xff", "\\u0000", "\"", "{", "]", "\\ud800", "\xc3", "null", ",", "\n"};
        s.insert(pick(static_cast<int>(s.size())), kInserts[pick(10)]);
      }
    }
    return s;
  }

  json random_value(int depth) {
    switch (pick(12)) {
      case 0: return nullptr;
      case 1: return pick(2) == 0;
      case 2: return -1;
      case 3: return 1e300;
      case 4: return static_cast<uint64_t>(-1);
      case 5: return "";
      case 6: return std::string(1 + pick(5000), 'a' + pick(26));
      case 7: return "\xf0\x9f\xa6\x99<｜end▁of▁sentence｜><｜DSML｜ calls>";
      case 8: return json::array();
      case 9: return json::object();
      case 10: {  // nesting, sometimes past the server's depth limit
        json v = 1;
        const int levels = pick(2) ? 10 : 80;
        for (int i = 0; i < levels; ++i) v = json::array({v});
        return v;
      }
      default: return depth < 3 ? json::array({random_value(depth + 1), random_value(depth + 1)}) : json(7);
    }
  }

  void mutate_tree(json& j, int depth) {
    if ((!j.is_object() && !j.is_array()) || j.empty() || pick(4) == 0) {
      j = random_value(depth);
      return;
    }
    if (j.is_object()) {
      auto it = j.begin();
      std::advance(it, pick(static_cast<int>(j.size())));
      if (pick(5) == 0) {
        j.erase(it.key());
        return;
      }
      mutate_tree(it.value(), depth + 1);
    } else {
      mutate_tree(j[pick(static_cast<int>(j.size()))], depth + 1);
    }
  }

  std::mt19937_64 rng_;
};

// Checks the shape of an answer: JSON with the API's error form, or a success (JSON or events).
void check_answer(const std::string& path, int status, const std::string& content_type, const std::string& body,
                  const std::string& sent) {
  ASSERT_TRUE(status == 200 || status == 400 || status == 413 || status == 429) << status << " for " << sent
                                                                               << "\n-> " << body;
  if (content_type == "text/event-stream") {
    EXPECT_EQ(status, 200);
    return;
  }
  const json parsed = json::parse(body, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << "not JSON: " << body;
  if (status == 200) return;
  if (path.rfind("/v1/messages", 0) == 0) {
    EXPECT_EQ(parsed["type"], "error") << body;
    EXPECT_TRUE(parsed["error"]["message"].is_string()) << body;
  } else {
    EXPECT_TRUE(parsed["error"]["message"].is_string()) << body;
    EXPECT_TRUE(parsed["error"]["type"].is_string()) << body;
  }
}

TEST(Fuzz, MutatedBodiesOverHttpNeverBreakTheServer) {
  ServerOptions options;
  options.max_body_bytes = 64 << 10;
  ScriptedEngineOptions engine_options;
  engine_options.max_batch = 2;
  engine_options.max_queue = 8;
  // Thinking-mode prompts (they open with the effort line) need a reply that closes its reasoning.
  auto engine = test::make_engine({{"Reasoning Effort", "hm</think>fine" + std::string(test::kEos)},
                                   {"", "fine" + std::string(test::kEos)}},
                                  engine_options);
  test::TestServer server(*engine, options);
  auto client = server.client();
  Mutator mutator(20240601);
  const int n = iterations(1500);
  int ok = 0, rejected = 0;
  for (int i = 0; i < n; ++i) {
    const Seed& seed = kSeeds[i % std::size(kSeeds)];
    const std::string body = mutator.mutate(seed.body);
    auto res = client->Post(seed.path, body, "application/json");
    ASSERT_TRUE(res) << "no answer (iteration " << i << "): " << httplib::to_string(res.error()) << "\n" << body;
    check_answer(seed.path, res->status, res->get_header_value("Content-Type"), res->body, body);
    if (HasFatalFailure()) return;
    (res->status == 200 ? ok : rejected)++;
  }
  auto health = client->Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  // Both outcomes must occur, or the mutations are too weak (or too strong) to test anything.
  EXPECT_GT(ok, n / 20);
  EXPECT_GT(rejected, n / 4);
  std::printf("fuzz over HTTP: %d requests, %d accepted, %d rejected with an API error\n", n, ok, rejected);
}

// The same mutations, many more of them, straight through parsing and prompt preparation.
TEST(Fuzz, MutatedBodiesThroughTheSchemas) {
  auto engine = test::make_engine({{"", "fine"}});
  ReplayStore replay;
  ChatService service(test::test_tokenizer(), *engine, replay, ServiceConfig{"cedar-test"});
  Mutator mutator(77);
  const int n = iterations(1500) * 13;
  for (int i = 0; i < n; ++i) {
    const Seed& seed = kSeeds[i % std::size(kSeeds)];
    OrderedJson body;
    if (parse_body(mutator.mutate(seed.body), &body)) continue;
    const std::string path = seed.path;
    ChatRequest chat;
    CompletionRequest completion;
    SchemaError e;
    if (path == "/v1/completions") {
      if (!parse_completion_request(body, &completion)) {
        auto p = service.prepare_completion(completion);
        if (auto* err = std::get_if<ApiError>(&p)) {
          EXPECT_LT(err->http_status(), 500) << err->message;
        }
      }
      continue;
    }
    e = path == "/v1/chat/completions" ? parse_chat_completion_request(body, &chat)
        : path == "/v1/responses"      ? parse_responses_request(body, &chat)
                                       : parse_messages_request(body, &chat);
    if (e) {
      EXPECT_EQ(e->http_status(), 400);
      continue;
    }
    auto p = service.prepare_chat(chat, "x-", "call_");
    if (auto* err = std::get_if<ApiError>(&p)) {
      EXPECT_LT(err->http_status(), 500) << err->message;
    }
  }
}

}  // namespace
}  // namespace cedar::serve
