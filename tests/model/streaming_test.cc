// Streamed experts and Engram rows give the same bits as the fully mapped model: logits and greedy
// tokens compared with memcmp on the tiny checkpoint, with caches far smaller than the checkpoint's
// experts (640) and Engram rows, in both numerics modes. Plus the prefill read count, the statistics
// sidecar, and the planner's errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "weights/residency_plan.h"
#include "spec/weight_inventory.h"
#include "tiny_model_util.h"

namespace cedar::model {
namespace {

using testing::load_tiny;
using testing::test_prompt;
using testing::tiny_checkpoint;

std::unique_ptr<Model> load_streamed(size_t expert_slots, size_t engram_slots, const std::string& stats = "",
                                     bool lookahead = true, bool io_uring = true) {
  ModelOptions o;
  o.residency.io_uring = io_uring;
  o.residency.direct_io = io_uring;  // the fallback case also takes buffered reads
  o.residency.expert_slots = expert_slots;
  o.residency.engram_slots = engram_slots;
  o.residency.stats_file = stats;
  o.residency.lookahead = lookahead;
  auto m = Model::load(tiny_checkpoint(0), o);
  if (!m.ok()) throw std::runtime_error(m.status().to_string());
  return std::move(*m);
}

// Prefill `prompt` then greedy-decode `n` tokens; returns every step's logits, concatenated.
std::vector<float> run(Model& m, const std::vector<int32_t>& prompt, int n, std::vector<int32_t>* out_tokens) {
  ThreadPool pool(2);
  SequenceState seq = m.new_sequence(static_cast<int64_t>(prompt.size()) + n + 1);
  const size_t V = m.config().vocab_size;
  std::vector<float> all, logits(V);
  SeqChunk ch{&seq, prompt};
  Status st = m.forward({&ch, 1}, logits.data(), &pool);
  if (!st.ok()) throw std::runtime_error(st.to_string());
  all.insert(all.end(), logits.begin(), logits.end());
  for (int i = 0; i < n; ++i) {
    const size_t sv = m.sampleable_vocab();
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + sv) - logits.begin());
    out_tokens->push_back(next);
    SeqChunk d{&seq, {&out_tokens->back(), 1}};
    st = m.forward({&d, 1}, logits.data(), &pool);
    if (!st.ok()) throw std::runtime_error(st.to_string());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

struct Case {
  ops::Numerics numerics;
  size_t expert_slots, engram_slots;
  bool io_uring = true;  // false: the pread pool with buffered reads (the fallback path)
};

class StreamingExactness : public ::testing::TestWithParam<Case> {};

TEST_P(StreamingExactness, LogitsAndTokensBitIdenticalToResident) {
  const Case c = GetParam();
  auto resident = load_tiny(0);
  resident->set_numerics(c.numerics);
  auto streamed = load_streamed(c.expert_slots, c.engram_slots, "", true, c.io_uring);
  streamed->set_numerics(c.numerics);
  ASSERT_FALSE(resident->streaming());
  ASSERT_TRUE(streamed->streaming());
  // Streamed tensors are not even mapped; dense ones are.
  EXPECT_EQ(streamed->checkpoint().find("layers.3.ffn.experts.5.w2.weight")->data, nullptr);
  EXPECT_EQ(streamed->checkpoint().find("layers.1.engram.embed.weight")->data, nullptr);
  EXPECT_NE(streamed->checkpoint().find("layers.3.ffn.shared_experts.w2.weight")->data, nullptr);
  EXPECT_NE(resident->checkpoint().find("layers.3.ffn.experts.5.w2.weight")->data, nullptr);
  const auto prompt = test_prompt(40, 7);
  std::vector<int32_t> ta, tb;
  const auto la = run(*resident, prompt, 12, &ta);
  const auto lb = run(*streamed, prompt, 12, &tb);
  EXPECT_EQ(ta, tb);
  ASSERT_EQ(la.size(), lb.size());
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
  // The caches really were too small: experts were read, and evicted ones read again.
  const ResidencyStats s = streamed->residency_stats();
  EXPECT_GT(s.expert_misses, 0u);
  EXPECT_GT(s.expert_bytes, 0u);
  EXPECT_GT(s.engram_misses, 0u);
}

INSTANTIATE_TEST_SUITE_P(Budgets, StreamingExactness,
                         ::testing::Values(Case{ops::Numerics::kExact, 8, 64}, Case{ops::Numerics::kFast, 8, 64},
                                           Case{ops::Numerics::kExact, 3, 5}, Case{ops::Numerics::kFast, 1, 1},
                                           Case{ops::Numerics::kExact, 200, 4096},
                                           Case{ops::Numerics::kFast, 6, 32, /*io_uring=*/false}));

TEST(Streaming, BudgetBelowCheckpointStreamsAndStaysExact) {
  const std::string dir = tiny_checkpoint(0);
  auto cfg = load_config(dir + "/config.json");
  ASSERT_TRUE(cfg.ok());
  const LayerPlan plan = make_layer_plan(*cfg);
  const ParamCounts counts = count_params(weight_inventory(*cfg));
  // Dense weights plus a quarter of the experts' and Engram tables' bytes (the planner keeps 2% of
  // the budget for the workspace): below the checkpoint's size, so they stream.
  const ResidencyPlan full = resident_plan(*cfg, plan, counts);
  const uint64_t budget =
      static_cast<uint64_t>((full.dense_bytes + (full.routed_expert_total + full.engram_table_total) / 4) / 0.98);
  ASSERT_LT(budget, static_cast<uint64_t>(counts.total_bytes()));
  ModelOptions o;
  o.residency.memory_budget = budget;
  auto m = Model::load(dir, o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE((*m)->streaming());
  EXPECT_LT((*m)->residency_plan().expert_slots, (*m)->residency_plan().n_experts);
  auto resident = load_tiny(0);
  const auto prompt = test_prompt(24, 3);
  std::vector<int32_t> ta, tb;
  const auto la = run(*resident, prompt, 6, &ta);
  const auto lb = run(**m, prompt, 6, &tb);
  EXPECT_EQ(ta, tb);
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
}

TEST(Streaming, PrefillOf512TokensReadsEachExpertAtMostOnce) {
  // 8 slots hold half a layer's 16 experts: the chunk's experts run in groups, each read once.
  auto m = load_streamed(8, 256, "", /*lookahead=*/true);
  ThreadPool pool(2);
  SequenceState seq = m->new_sequence(600);
  const auto prompt = test_prompt(512, 11);
  std::vector<float> logits(m->config().vocab_size);
  m->reset_residency_stats();
  SeqChunk ch{&seq, prompt};
  ASSERT_TRUE(m->forward({&ch, 1}, logits.data(), &pool).ok());
  const ResidencyStats s = m->residency_stats();
  EXPECT_EQ(s.max_reads_per_expert, 1u);
  // 512 tokens x 6 choices among 16 experts: every expert of every layer is needed, so exactly
  // n_layers * 16 reads happened (none of them repeated).
  EXPECT_EQ(s.expert_misses, static_cast<uint64_t>(m->config().n_layers) * 16);
  EXPECT_EQ(s.expert_hits, 0u);
}

TEST(Streaming, LookaheadIsMeasuredDuringDecode) {
  auto m = load_streamed(64, 256);
  const auto prompt = test_prompt(20, 5);
  std::vector<int32_t> t;
  run(*m, prompt, 8, &t);
  const LookaheadStats la = m->lookahead_stats();
  // 8 decode steps x 39 layer transitions x 6 guesses.
  EXPECT_EQ(la.predicted, 8u * 39 * 6);
  EXPECT_LE(la.correct, la.predicted);
}

TEST(Streaming, StatisticsSidecarMakesTheNextStartWarm) {
  const std::string stats = ::testing::TempDir() + "/cedar_stream_stats_" + std::to_string(::getpid());
  std::filesystem::remove(stats);
  const auto prompt = test_prompt(30, 9);
  {
    auto m = load_streamed(64, 256, stats);
    std::vector<int32_t> t;
    run(*m, prompt, 4, &t);
    ASSERT_TRUE(m->save_residency_stats().ok());
  }
  ASSERT_TRUE(std::filesystem::exists(stats));
  auto cold = load_streamed(64, 256);
  auto warm = load_streamed(64, 256, stats);
  std::vector<int32_t> a, b;
  run(*cold, prompt, 4, &a);
  run(*warm, prompt, 4, &b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(cold->residency_stats().expert_hits + cold->residency_stats().expert_misses,
            warm->residency_stats().expert_hits + warm->residency_stats().expert_misses);
  EXPECT_GT(warm->residency_stats().expert_hits, cold->residency_stats().expert_hits);
  // A damaged sidecar is ignored (a cold start), not an error.
  { std::ofstream(stats, std::ios::trunc) << "not statistics"; }
  auto again = load_streamed(64, 256, stats);
  EXPECT_TRUE(again->streaming());
  std::filesystem::remove(stats);
}

TEST(Streaming, UnwritableSidecarIsAClearError) {
  auto m = load_streamed(16, 64, "/proc/cedar-no-such-dir/stats");
  std::vector<int32_t> t;
  run(*m, test_prompt(8, 1), 1, &t);
  const Status st = m->save_residency_stats();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--residency-stats"), std::string::npos) << st.message();
}

TEST(Streaming, BudgetBelowDenseWeightsNamesTheFix) {
  ModelOptions o;
  o.residency.memory_budget = 4 << 20;  // 4 MiB: the tiny model's embeddings alone are 33 MB
  auto m = Model::load(tiny_checkpoint(0), o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(m.status().message().find("raise --memory-budget to at least"), std::string::npos)
      << m.status().message();
}

}  // namespace
}  // namespace cedar::model
