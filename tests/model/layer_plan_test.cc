// The layer plan against the spec's per-layer CSA2 table (§4.5), written out by hand here.
#include "spec/layer_plan.h"

#include <gtest/gtest.h>

#include "model_test_util.h"

namespace cedar::model {
namespace {

struct Row {
  const char* mode;
  int kv_from, index_keys_from, topk_from;
  CandidateRole candidate;
};

// Spec §4.5, one row per backbone layer 0..39.
Row spec_row(int l) {
  if (l < 2) return {"SWA", -1, -1, -1, CandidateRole::kNone};
  if (l < 20) {
    const int src = l < 8 ? 2 : l < 14 ? 8 : 14;
    return l == src ? Row{"Full", src, src, src, CandidateRole::kNone}
                    : Row{"Reuse", src, -1, src, CandidateRole::kNone};
  }
  if (l == 20) return {"Full", 20, 20, 20, CandidateRole::kBuildsPool};
  if (l < 24) return {"Reuse", 20, -1, 20, CandidateRole::kNone};
  const int reindex = l - (l % 4);  // 24, 28, 32, 36
  if (l == reindex) return {"Reindex", 20, 20, l, CandidateRole::kConsumer};
  return {"Reuse", 20, -1, reindex, CandidateRole::kNone};
}

TEST(LayerPlan, ReleasedV41MatchesSpecTable) {
  const ModelConfig c = testing::released_v41();
  const LayerPlan plan = make_layer_plan(c);
  ASSERT_EQ(plan.layers.size(), 43u);
  for (int l = 0; l < 40; ++l) {
    const LayerPlanEntry& e = plan.layers[l];
    const Row want = spec_row(l);
    SCOPED_TRACE("layer " + std::to_string(l));
    EXPECT_STREQ(attn_mode_name(e.mode), want.mode);
    EXPECT_EQ(e.kv_from, want.kv_from);
    EXPECT_EQ(e.index_keys_from, want.index_keys_from);
    EXPECT_EQ(e.topk_from, want.topk_from);
    EXPECT_EQ(e.candidate, want.candidate);
    EXPECT_EQ(e.candidate_from, want.candidate == CandidateRole::kConsumer ? 20 : -1);
    EXPECT_EQ(e.compress_ratio, l < 2 ? 0 : l < 20 ? 2 : 1);
    EXPECT_DOUBLE_EQ(e.rope.theta, l < 2 ? 10000 : 160000);
    EXPECT_EQ(e.rope.yarn, l >= 2);
    EXPECT_EQ(e.engram, l == 1 || l == 14);
    EXPECT_EQ(e.dspark_target, l >= 37);
    EXPECT_EQ(e.encoder, l < 20);
    EXPECT_FALSE(e.is_mtp);
    EXPECT_EQ(e.n_routed_experts, 384);
  }
  for (int l = 40; l < 43; ++l) {
    const LayerPlanEntry& e = plan.layers[l];
    EXPECT_TRUE(e.is_mtp);
    EXPECT_EQ(e.mode, AttnMode::kSwa);
    EXPECT_DOUBLE_EQ(e.rope.theta, 10000);
    EXPECT_FALSE(e.rope.yarn);
    EXPECT_EQ(e.n_routed_experts, 128);
    EXPECT_EQ(e.n_activated_experts, 3);
  }
  EXPECT_EQ(plan.kv_owner_layers, (std::vector<int>{2, 8, 14, 20}));
}

TEST(LayerPlan, V4FlashOwnsEveryCompressor) {
  auto c = load_config(testing::source_path("configs/deepseek-v4-flash.json"));
  ASSERT_TRUE(c.ok());
  const LayerPlan plan = make_layer_plan(*c);
  ASSERT_EQ(plan.layers.size(), 44u);
  EXPECT_EQ(plan.layers[0].mode, AttnMode::kSwa);
  EXPECT_TRUE(plan.layers[2].hash_routed);
  EXPECT_FALSE(plan.layers[3].hash_routed);
  EXPECT_EQ(plan.layers[2].mode, AttnMode::kCsa);
  EXPECT_EQ(plan.layers[3].mode, AttnMode::kHca);
  EXPECT_EQ(plan.layers[42].mode, AttnMode::kCsa);
  EXPECT_EQ(plan.layers[43].mode, AttnMode::kSwa);
  EXPECT_EQ(plan.kv_owner_layers.size(), 41u);  // layers 2..42
  EXPECT_EQ(plan.layers[3].index_keys_from, -1);
}

}  // namespace
}  // namespace cedar::model
