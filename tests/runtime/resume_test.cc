// A two-turn conversation through the durable prefix cache: turn 1, a "restart" (every cache object
// destroyed, only the directory survives), turn 2 resumed from disk. Full replay must equal a cold
// run; bounded replay must do bounded work (window + new suffix) and stay close.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/thread_pool.h"
#include "runtime/local_engine.h"
#include "runtime/prefix_store.h"
#include "../model/tiny_model_util.h"

namespace cedar::runtime {
namespace {

struct Turn {
  std::vector<int32_t> ids;
  GenerationResult stats;
  int64_t computed_tokens = 0;   // prompt tokens the forward pass ran (replay + new suffix)
  std::vector<float> first_top;  // the first token's top-20 log-probabilities: a fingerprint of its logits
};

// One turn through the engine (a fresh one per turn: a "new process" sees only the cache directory).
Turn run(uint64_t seed, const std::vector<int32_t>& prompt, int n, const std::string& cache_dir, ReplayMode mode) {
  EngineOptions o;
  o.threads = 2;
  o.max_batch = 1;
  o.max_context = static_cast<int>(prompt.size()) + n + 1;
  o.prefix_cache = !cache_dir.empty();
  o.cache_dir = cache_dir;
  o.kv_block_tokens = 32;
  o.replay_full = mode == ReplayMode::kFull;
  auto engine = make_engine(model::testing::load_tiny(seed), o, "tiny");
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  GenerationRequest request;
  request.prompt_ids = prompt;
  request.sampling.max_tokens = n;
  request.sampling.temperature = 0;
  request.sampling.ignore_eos = true;
  request.logprobs = true;
  request.top_logprobs = kMaxTopLogprobs;
  Turn t;
  auto result = generate(**engine, request, [&](const GenerationStream::Update& u) {
    if (t.first_top.empty() && u.logprobs.size() > 0)
      t.first_top.assign(u.logprobs.top_logprobs.begin(), u.logprobs.top_logprobs.begin() + u.logprobs.k);
    return true;
  });
  EXPECT_TRUE(result.ok()) << result.status().to_string();
  t.stats = *result;
  t.ids = result->output_ids;
  t.computed_tokens = result->prompt_tokens - result->cached_tokens + result->replayed_tokens;
  return t;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

TEST(Resume, TwoTurnsAcrossARestart) {
  auto m = model::testing::load_tiny(6);
  const uint64_t seed = 6;
  const std::string dir = std::string(CEDAR_BINARY_DIR) + "/runtime_test_data/kv_resume";
  std::filesystem::remove_all(dir);
  const auto turn1_prompt = model::testing::test_prompt(150, 21);
  Turn t1 = run(seed, turn1_prompt, 20, dir, ReplayMode::kBounded);
  EXPECT_EQ(t1.stats.cached_tokens, 0);
  // Turn 2 = turn 1's prompt and answer plus a new user message, in a "new process".
  std::vector<int32_t> prompt2 = turn1_prompt;
  prompt2.insert(prompt2.end(), t1.ids.begin(), t1.ids.end());
  const auto suffix = model::testing::test_prompt(30, 22);
  prompt2.insert(prompt2.end(), suffix.begin(), suffix.end());

  Turn cold = run(seed, prompt2, 10, "", ReplayMode::kFull);
  Turn bounded = run(seed, prompt2, 10, dir, ReplayMode::kBounded);  // (then saves turn 2 too)
  Turn full = run(seed, prompt2, 10, dir, ReplayMode::kFull);

  // Full replay recomputes everything: identical to a run without any cache.
  EXPECT_EQ(full.ids, cold.ids);
  ASSERT_EQ(cold.first_top.size(), static_cast<size_t>(kMaxTopLogprobs));
  EXPECT_EQ(full.first_top, cold.first_top);
  // Bounded replay: turn 1 stored its 169 fed tokens (5 whole 32-token blocks and a 9-token tail);
  // the resume restores them, replays one window (16) and computes the 30 + 1 new tokens.
  const int64_t window = m->config().window_size;
  EXPECT_EQ(bounded.stats.cached_tokens, 169);
  EXPECT_EQ(bounded.stats.replayed_tokens, window);
  EXPECT_EQ(bounded.computed_tokens, static_cast<int64_t>(prompt2.size()) - 169 + window);
  for (float v : bounded.first_top) ASSERT_TRUE(std::isfinite(v));
  const double d = max_diff(bounded.first_top, cold.first_top);
  // An approximation by design (spec §8): report the size of the difference.
  std::printf("bounded replay vs cold: max |top-20 logprob diff| %.4f, computed %lld of %zu tokens\n", d,
              static_cast<long long>(bounded.computed_tokens), prompt2.size());
  EXPECT_GT(d, 0.0);
}

}  // namespace
}  // namespace cedar::runtime

namespace cedar::runtime {
namespace {

// The next turn re-renders the previous answer differently from the generated tokens (as after a
// restart with a random model, a non-canonical tokenization or dropped reasoning): the whole blocks
// of the previous prompt plus its tail (ending inside a block, and inside a ratio-2 group) are
// restored, so cached_tokens covers the whole previous prompt.
TEST(Resume, PreviousPromptIsCachedToItsLastToken) {
  auto m = model::testing::load_tiny(6);
  const uint64_t seed = 6;
  const std::string dir = std::string(CEDAR_BINARY_DIR) + "/runtime_test_data/kv_resume_tail";
  std::filesystem::remove_all(dir);
  const auto turn1_prompt = model::testing::test_prompt(151, 31);  // 4 blocks of 32 + 23
  Turn t1 = run(seed, turn1_prompt, 20, dir, ReplayMode::kBounded);
  // Turn 1's whole blocks alone (no tails), for a resume at a block boundary below.
  const std::string blocks_only = dir + "_blocks";
  std::filesystem::remove_all(blocks_only);
  std::filesystem::create_directories(blocks_only);
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".kvb") std::filesystem::copy(e.path(), blocks_only);
  std::vector<int32_t> prompt2 = turn1_prompt;
  const auto rerendered = model::testing::test_prompt(25, 32);  // not the generated ids
  prompt2.insert(prompt2.end(), rerendered.begin(), rerendered.end());

  Turn cold = run(seed, prompt2, 8, "", ReplayMode::kFull);
  Turn bounded = run(seed, prompt2, 8, dir, ReplayMode::kBounded);  // a "new process": only the files
  const int64_t window = m->config().window_size;
  EXPECT_EQ(bounded.stats.cached_tokens, 151);
  EXPECT_EQ(bounded.stats.replayed_tokens, window);
  EXPECT_EQ(bounded.computed_tokens, static_cast<int64_t>(prompt2.size()) - 151 + window);
  for (float v : bounded.first_top) ASSERT_TRUE(std::isfinite(v));
  // The same turn resumed from the whole blocks only: a resume at a block boundary, the
  // approximation bounded replay always had.
  Turn aligned = run(seed, prompt2, 8, blocks_only, ReplayMode::kBounded);
  EXPECT_EQ(aligned.stats.cached_tokens, 128);
  const double d_tail = max_diff(bounded.first_top, cold.first_top);
  const double d_aligned = max_diff(aligned.first_top, cold.first_top);
  std::printf("resume inside a block and a group: max |top-20 logprob diff| vs cold %.4f (at a block boundary: %.4f)\n",
              d_tail, d_aligned);
  EXPECT_GT(d_tail, 0.0);
}

}  // namespace
}  // namespace cedar::runtime
