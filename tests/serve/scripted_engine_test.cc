// ScriptedEngine: the test double must keep the Engine contract (runtime/engine.h) so the server
// is tested against the behaviour the real engine promises. Expectations are hand-worked.
#include <gtest/gtest.h>

#include "serve/api/script_file.h"
#include "runtime/scripted_engine.h"
#include "serve_test_util.h"

namespace cedar::serve {
namespace {

runtime::GenerationRequest request_for(const std::vector<int32_t>& prompt, int max_tokens = 100) {
  runtime::GenerationRequest r;
  r.prompt_ids = prompt;
  r.sampling.max_tokens = max_tokens;
  return r;
}

TEST(ScriptedEngine, PlaysTheFirstMatchingReply) {
  auto engine = test::make_engine({{"weather", "W"}, {"", "D"}});
  auto a = runtime::generate(*engine, request_for(test::ids_of("what is the weather")));
  auto b = runtime::generate(*engine, request_for(test::ids_of("hello")));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->output_ids, test::ids_of("W"));
  EXPECT_EQ(b->output_ids, test::ids_of("D"));
}

TEST(ScriptedEngine, NoMatchingReplyIsAClearError) {
  auto engine = test::make_engine({{"weather", "W"}});
  auto r = runtime::generate(*engine, request_for(test::ids_of("hello")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("hello"), std::string::npos);
}

TEST(ScriptedEngine, StopsAtEosInclusive) {
  auto engine = test::make_engine({{"", std::string("ab") + test::kEos + "cd"}});
  auto r = runtime::generate(*engine, request_for(test::ids_of("x")));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->output_ids, test::ids_of(std::string("ab") + test::kEos));
  EXPECT_EQ(r->finish_reason, runtime::FinishReason::kStop);
}

TEST(ScriptedEngine, MaxTokensCutsWithLength) {
  auto engine = test::make_engine({{"", std::string("abcdef") + test::kEos}});
  auto r = runtime::generate(*engine, request_for(test::ids_of("x"), 3));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->output_ids.size(), 3u);
  EXPECT_EQ(r->finish_reason, runtime::FinishReason::kLength);
}

TEST(ScriptedEngine, ExtraStopIdsEndTheOutput) {
  auto engine = test::make_engine({{"", std::string("abcdef") + test::kEos}});
  auto req = request_for(test::ids_of("x"));
  req.sampling.stop_ids = {test::ids_of("c")[0]};
  auto r = runtime::generate(*engine, req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->output_ids, test::ids_of("abc"));
  EXPECT_EQ(r->finish_reason, runtime::FinishReason::kStop);
}

TEST(ScriptedEngine, CancellingTheStreamEndsTheRequest) {
  ScriptedEngineOptions slow;
  slow.token_delay = std::chrono::milliseconds(20);  // the cancel lands long before the reply's end
  auto engine = test::make_engine({{"", std::string(40, 'a') + test::kEos}}, slow);
  auto req = request_for(test::ids_of("x"));
  size_t seen = 0;
  auto r = runtime::generate(*engine, req, [&](const runtime::GenerationStream::Update& u) {
    seen += u.tokens.size();
    return seen < 2;
  });
  ASSERT_TRUE(r.ok());
  EXPECT_GE(r->output_ids.size(), 2u);
  EXPECT_LT(r->output_ids.size(), 41u);
  EXPECT_EQ(r->finish_reason, runtime::FinishReason::kCancelled);
}

TEST(ScriptedEngine, EmulatedPrefixCacheReportsTheLongestStoredPrefix) {
  auto engine = test::make_engine({{"", "OK"}});
  const std::vector<int32_t> p1 = test::ids_of("abcdef");  // byte tokens: 6 ids
  auto r1 = runtime::generate(*engine, request_for(p1));
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->cached_tokens, 0);
  // p1 + "OK" is stored: a prompt extending it shares 8 tokens.
  auto r2 = runtime::generate(*engine, request_for(test::ids_of("abcdefOKmore")));
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->cached_tokens, 8);
  // A prompt equal to a stored sequence still computes its last token.
  auto r3 = runtime::generate(*engine, request_for(test::ids_of("abcdef")));
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(r3->cached_tokens, 5);
  auto r4 = runtime::generate(*engine, request_for(test::ids_of("zzz")));
  EXPECT_EQ(r4->cached_tokens, 0);
  const runtime::EngineStats s = engine->stats();
  EXPECT_EQ(s.requests, 4u);
  EXPECT_EQ(s.prefix_hits, 2u);
  EXPECT_EQ(s.prefix_misses, 2u);
  EXPECT_EQ(s.cached_tokens, 13u);
  EXPECT_EQ(s.output_tokens, 8u);
}

TEST(ScriptedEngine, RefusesWhatTheRealEngineRefuses) {
  auto engine = test::make_engine({{"", "OK"}}, {}, /*max_context=*/10);
  EXPECT_EQ(runtime::generate(*engine, request_for({})).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime::generate(*engine, request_for(test::ids_of("abcdefgh"), 5)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime::generate(*engine, request_for({1 << 30})).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime::generate(*engine, request_for(test::ids_of("ab"), 0)).status().code(), StatusCode::kInvalidArgument);
}

TEST(ScriptFile, ParsesRepliesAndOptions) {
  const auto& tok = test::test_tokenizer();
  auto script = parse_script(R"({"token_delay_ms": 3, "max_active": 2, "replies": [
      {"when_prompt_contains": "x", "completion": "hi<｜end▁of▁sentence｜>"},
      {"completion_ids": [5, 1]}]})",
                             tok, "t.json");
  ASSERT_TRUE(script.ok()) << script.status().to_string();
  EXPECT_EQ(script->options.token_delay, std::chrono::milliseconds(3));
  EXPECT_EQ(script->options.max_active, 2);
  ASSERT_EQ(script->replies.size(), 2u);
  EXPECT_EQ(script->replies[0].when_prompt_contains, "x");
  EXPECT_EQ(script->replies[0].output_ids.back(), 1);  // the EOS marker became its id
  EXPECT_EQ(script->replies[1].output_ids, (std::vector<int32_t>{5, 1}));
}

TEST(ScriptFile, ErrorsNameTheFileAndField) {
  const auto& tok = test::test_tokenizer();
  struct Case {
    const char* text;
    const char* needle;
  } cases[] = {
      {"not json", "t.json: not valid JSON"},
      {"[]", "top level must be a JSON object"},
      {R"({"replies": []})", "\"replies\" must be a non-empty array"},
      {R"({"replies": [{"completion": "a", "completion_ids": [1]}]})", "replies[0]"},
      {R"({"replies": [{"completion_ids": [-1]}]})", "replies[0].completion_ids"},
      {R"({"token_delay_ms": -1, "replies": [{"completion": "a"}]})", "token_delay_ms"},
      {R"({"replies": [{"completion": ""}]})", "empty completion"},
  };
  for (const Case& c : cases) {
    auto r = parse_script(c.text, tok, "t.json");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(load_script(test::data_dir() + "/no-such-script.json", tok).ok());
}

}  // namespace
}  // namespace cedar::serve
