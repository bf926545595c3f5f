// A two-turn conversation through the durable prefix cache: turn 1, a "restart" (every cache object
// destroyed, only the directory survives), turn 2 resumed from disk. Full replay must equal a cold
// run; bounded replay must do bounded work (window + new suffix) and stay close.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/thread_pool.h"
#include "runtime/generator.h"
#include "../model/tiny_model_util.h"

namespace cedar::runtime {
namespace {

struct Turn {
  std::vector<int32_t> ids;
  GenerateStats stats;
};

Turn run(model::Model& m, const std::vector<int32_t>& prompt, int n, const std::string& cache_dir, ReplayMode mode) {
  ThreadPool pool(2);
  Turn t;
  std::unique_ptr<PrefixStore> store;
  GenerateOptions o;
  o.max_new_tokens = n;
  o.stop_at_eos = false;
  if (!cache_dir.empty()) {
    PrefixStoreOptions po;
    po.disk_dir = cache_dir;
    po.block_tokens = 32;
    auto ps = PrefixStore::create(m, po);
    EXPECT_TRUE(ps.ok()) << ps.status().to_string();
    store = std::move(*ps);
    o.prefix_store = store.get();
    o.replay = mode;
  }
  auto out = generate(m, prompt, o, nullptr, &t.stats, &pool);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  t.ids = *out;
  return t;
}

TEST(Resume, TwoTurnsAcrossARestart) {
  auto m = model::testing::load_tiny(6);
  const std::string dir = std::string(CEDAR_BINARY_DIR) + "/runtime_test_data/kv_resume";
  std::filesystem::remove_all(dir);
  const auto turn1_prompt = model::testing::test_prompt(150, 21);
  Turn t1 = run(*m, turn1_prompt, 20, dir, ReplayMode::kBounded);
  EXPECT_EQ(t1.stats.cached_tokens, 0);
  // Turn 2 = turn 1's prompt and answer plus a new user message, in a "new process".
  std::vector<int32_t> prompt2 = turn1_prompt;
  prompt2.insert(prompt2.end(), t1.ids.begin(), t1.ids.end());
  const auto suffix = model::testing::test_prompt(30, 22);
  prompt2.insert(prompt2.end(), suffix.begin(), suffix.end());

  Turn cold = run(*m, prompt2, 10, "", ReplayMode::kFull);
  Turn bounded = run(*m, prompt2, 10, dir, ReplayMode::kBounded);  // (then saves turn 2 too)
  Turn full = run(*m, prompt2, 10, dir, ReplayMode::kFull);

  // Full replay recomputes everything: identical to a run without any cache.
  EXPECT_EQ(full.ids, cold.ids);
  EXPECT_EQ(full.stats.first_logits, cold.stats.first_logits);
  // Bounded replay: turn 1 stored 160 of its 169 fed tokens (whole 32-token blocks); the resume
  // restores them, replays one window (16) and computes the 30 + 9 new tokens.
  const int64_t window = m->config().window_size;
  EXPECT_EQ(bounded.stats.cached_tokens, 160);
  EXPECT_EQ(bounded.stats.replayed_tokens, window);
  EXPECT_EQ(bounded.stats.computed_tokens, static_cast<int64_t>(prompt2.size()) - 160 + window);
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < cold.stats.first_logits.size(); ++i) {
    ASSERT_TRUE(std::isfinite(bounded.stats.first_logits[i]));
    max_diff = std::max(max_diff, std::fabs(double(bounded.stats.first_logits[i]) - cold.stats.first_logits[i]));
    max_abs = std::max(max_abs, std::fabs(double(cold.stats.first_logits[i])));
  }
  // An approximation by design (spec §8): report the size of the difference.
  std::printf("bounded replay vs cold: max |logit diff| %.4f (max |logit| %.4f), computed %lld of %zu tokens\n",
              max_diff, max_abs, static_cast<long long>(bounded.stats.computed_tokens), prompt2.size());
  EXPECT_GT(max_diff, 0.0);
}

}  // namespace
}  // namespace cedar::runtime
