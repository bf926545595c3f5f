// LocalEngine's server-wide memory limit: a request that cannot fit alone is refused with an error
// naming the fix; requests that fit only one at a time wait for room and all complete.
#include "runtime/local_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "model/sequence_state.h"
#include "../model/tiny_model_util.h"

namespace cedar::runtime {
namespace {

TEST(LocalEngine, SequenceStateEstimateIsWhatIsAllocated) {
  auto m = model::testing::load_tiny(2);
  for (int64_t cap : {1, 17, 64, 301}) {
    const model::SequenceState s = m->new_sequence(cap);
    EXPECT_EQ(model::sequence_state_bytes(m->config(), m->plan(), cap), model::held_bytes(s)) << cap;
  }
}

TEST(LocalEngine, MemoryLimitRefusesOversizeAndQueuesTheRest) {
  auto m = model::testing::load_tiny(2);
  const uint64_t one = model::sequence_state_bytes(m->config(), m->plan(), 20 + 6 + 1);
  EngineOptions o;
  o.threads = 1;
  o.kv_memory_bytes = one + one / 2;  // room for one request of 20 + 6 tokens at a time
  auto engine = make_engine(model::testing::tiny_checkpoint(2), o);
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();

  GenerationRequest big;
  big.prompt_ids = model::testing::test_prompt(40, 1);
  big.sampling.max_tokens = 5000;
  auto refused = (*engine)->generate(big);
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
      r.on_token = [&](int32_t) {
        const int active = (*engine)->stats().active_sequences;
        int seen = most_active.load();
        while (active > seen && !most_active.compare_exchange_weak(seen, active)) {
        }
        return true;
      };
      auto out = (*engine)->generate(r);
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

}  // namespace
}  // namespace cedar::runtime
