// LocalEngine, cedar's one decode loop: the server-wide memory limit (a request that cannot fit
// alone is refused with an error naming the fix; requests that fit only one at a time wait for room
// and all complete), and chunked prefill (a long prompt advances a chunk per step beside the
// running sequences, with the logits of the model's own chunked forward).
#include "runtime/local_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <thread>

#include "core/thread_pool.h"
#include "model/sequence_state.h"
#include "../model/tiny_model_util.h"

namespace cedar::runtime {
namespace {

// A state filled to its capacity holds what the engine's memory limit reserved for it.
TEST(LocalEngine, SequenceStateEstimateIsWhatAFullStateHolds) {
  auto m = model::testing::load_tiny(2);
  for (int64_t cap : {1, 17, 64, 301}) {
    model::SequenceState s = m->new_sequence(cap);
    const std::vector<int32_t> ids = model::testing::test_prompt(static_cast<size_t>(cap), 3);
    const model::SeqChunk chunk{&s, ids};
    std::vector<float> logits(m->config().vocab_size);
    ASSERT_TRUE(m->forward({&chunk, 1}, logits.data(), nullptr).ok()) << cap;
    EXPECT_EQ(model::sequence_state_bytes(s.geometry(), cap), model::held_bytes(s)) << cap;
  }
}

TEST(LocalEngine, MemoryLimitRefusesOversizeAndQueuesTheRest) {
  auto m = model::testing::load_tiny(2);
  const uint64_t one = model::sequence_state_bytes(*m->kv_geometry(), 20 + 6 + 1);
  EngineOptions o;
  o.threads = 1;
  o.kv_memory_bytes = one + one / 2;  // room for one request of 20 + 6 tokens at a time
  auto engine = make_engine(model::testing::tiny_checkpoint(2), o);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();

  GenerationRequest big;
  big.prompt_ids = model::testing::test_prompt(40, 1);
  big.sampling.max_tokens = 5000;
  auto refused = runtime::generate(**engine, big);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("KV memory limit"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("lower max_tokens"), std::string::npos);

  std::atomic<int> most_active{0};
  std::vector<std::thread> clients;
  std::vector<Status> results(3);
  for (int c = 0; c < 3; ++c)
    clients.emplace_back([&, c] {
      GenerationRequest r;
      r.prompt_ids = model::testing::test_prompt(20, 10 + c);
      r.sampling.max_tokens = 6;
      r.sampling.seed = c;
      auto out = runtime::generate(**engine, r, [&](const GenerationStream::Update&) {
        const int active = (*engine)->stats().active_sequences;
        int seen = most_active.load();
        while (active > seen && !most_active.compare_exchange_weak(seen, active)) {
        }
        return true;
      });
      results[c] = out.ok() ? Status() : out.status();
      if (out.ok()) {
        EXPECT_GE(out->output_ids.size(), 1u);
      }
    });
  for (auto& t : clients) t.join();
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(most_active.load(), 1);
  const EngineStats st = (*engine)->stats();
  EXPECT_EQ(st.sequence_bytes, 0u);
  EXPECT_EQ(st.requests, 3u);
}

// Starts a request that decodes for a long while, and waits for its first token (it is running).
std::shared_ptr<GenerationStream> start_decoder(Engine& engine, uint32_t salt) {
  GenerationRequest r;
  r.prompt_ids = model::testing::test_prompt(8, salt);
  r.sampling.max_tokens = 200;
  r.sampling.ignore_eos = true;
  auto stream = engine.submit(r);
  EXPECT_TRUE(stream.ok()) << stream.status().to_string();
  if (!stream.ok()) return nullptr;
  for (GenerationStream::Update u; u.tokens.empty() && !u.finished;) u = (*stream)->next();
  return *stream;
}

TEST(LocalEngine, ALongPromptPrefillsInChunksBesideTheDecodingSequences) {
  constexpr size_t kPrompt = 200, kChunk = 32;
  const auto long_prompt = model::testing::test_prompt(kPrompt, 77);
  // The model's own forward in chunks of kChunk: what the engine must reproduce bit for bit.
  std::vector<float> expected;
  {
    auto m = model::testing::load_tiny(4);
    ThreadPool pool(1);
    model::SequenceState seq = m->new_sequence(kPrompt + 2);
    expected.resize(m->config().vocab_size);
    for (size_t pos = 0; pos < kPrompt; pos += kChunk) {
      model::SeqChunk c{&seq, std::span<const int32_t>(long_prompt).subspan(pos, std::min(kChunk, kPrompt - pos))};
      ASSERT_TRUE(m->forward({&c, 1}, expected.data(), &pool).ok());
    }
  }
  auto m = model::testing::load_tiny(4);
  const size_t vocab = m->sampleable_vocab();
  // Steps that ran three sequences: the two decoders and the long prompt's chunks.
  std::atomic<int> three_sequence_steps{0};
  m->set_layer_observer([&](int layer, const float*, size_t n_chunks) {
    if (layer == 0 && n_chunks == 3) three_sequence_steps++;
  });
  EngineOptions o;
  o.threads = 1;
  o.prefill_chunk = kChunk;
  o.prefix_cache = false;
  auto engine = make_engine(std::move(m), o, "tiny");
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  auto a = start_decoder(**engine, 1), b = start_decoder(**engine, 2);
  ASSERT_TRUE(a && b);

  GenerationRequest r;
  r.prompt_ids = long_prompt;
  r.sampling.max_tokens = 1;
  r.sampling.temperature = 0;  // greedy
  r.logprobs = true;
  r.top_logprobs = 1;
  float logprob = 0;
  auto result = runtime::generate(**engine, r, [&](const GenerationStream::Update& u) {
    if (u.logprobs.size() > 0) logprob = u.logprobs.logprob[0];
    return true;
  });
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  // ceil(200 / 32) = 7 steps, each with one decode token of both running sequences (one whole-prompt
  // step without chunking).
  EXPECT_GE(three_sequence_steps.load(), static_cast<int>((kPrompt + kChunk - 1) / kChunk));
  // The long prompt's token: the greedy pick of the chunked forward's logits, with their logprob.
  const int32_t token = result->output_ids.at(0);
  const auto argmax = std::max_element(expected.begin(), expected.begin() + vocab) - expected.begin();
  EXPECT_EQ(token, argmax);
  double mx = expected[0], sum = 0;
  for (size_t i = 0; i < vocab; ++i) mx = std::max<double>(mx, expected[i]);
  for (size_t i = 0; i < vocab; ++i) sum += std::exp(double(expected[i]) - mx);
  EXPECT_NEAR(logprob, double(expected[token]) - mx - std::log(sum), 1e-5);
  for (auto& s : {a, b}) {
    s->cancel();
    while (!s->next().finished) {
    }
    ASSERT_TRUE(s->result().ok());
    EXPECT_EQ(s->result()->finish_reason, FinishReason::kCancelled);
  }
}

}  // namespace
}  // namespace cedar::runtime
