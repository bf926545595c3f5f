// Tensor inventory of the released config: counts and sizes reported for the released checkpoint
// (48 shards, 96,085 tensors, 475.2 GiB of payload; 552B backbone + ~196.6B Engram + 14.2B DSpark +
// 0.5B vision, per spec §3 and the landscape notes), plus shapes of spec §3's table.
#include "spec/weight_inventory.h"

#include <gtest/gtest.h>

#include <map>

#include "model_test_util.h"

namespace cedar::model {
namespace {

TEST(Inventory, ReleasedCountsMatchPublishedFigures) {
  const auto inv = weight_inventory(testing::released_v41());
  const ParamCounts pc = count_params(inv);
  EXPECT_EQ(pc.n_tensors, 96085);
  EXPECT_NEAR(pc.total_bytes() / double(1ull << 30), 475.2, 0.1);
  EXPECT_NEAR(pc.backbone / 1e9, 552.0, 0.5);
  EXPECT_NEAR(pc.engram / 1e9, 196.6, 0.1);
  EXPECT_NEAR(pc.dspark / 1e9, 14.2, 0.1);
  EXPECT_NEAR(pc.vision / 1e9, 0.5, 0.05);
  EXPECT_NEAR(pc.total() / 1e9, 763.2, 0.1);
}

TEST(Inventory, ShapesFollowSpecTable) {
  const auto inv = weight_inventory(testing::released_v41());
  std::map<std::string, const WeightSpec*> by;
  for (const auto& w : inv) by[w.name] = &w;
  auto expect = [&](const std::string& n, Dtype d, std::vector<int64_t> shape) {
    ASSERT_TRUE(by.count(n)) << n;
    EXPECT_EQ(by[n]->dtype, d) << n;
    EXPECT_EQ(by[n]->shape, shape) << n;
  };
  expect("layers.0.hc_attn_fn", Dtype::kF32, {24, 20480});
  expect("layers.0.attn.wq_a.weight", Dtype::kF8E4M3, {1280, 5120});
  expect("layers.0.attn.wq_a.scale", Dtype::kF8E8M0, {40, 160});
  expect("layers.0.attn.wq_b.scale", Dtype::kF8E8M0, {1024, 40});
  expect("layers.0.attn.wkv.scale", Dtype::kF8E8M0, {16, 160});
  expect("layers.0.attn.wo_a.weight", Dtype::kF8E4M3, {8192, 4096});
  expect("layers.0.attn.wo_a.scale", Dtype::kF8E8M0, {256, 128});
  expect("layers.0.attn.wo_b.scale", Dtype::kF8E8M0, {160, 256});
  expect("layers.2.attn.compressor.wgate.weight", Dtype::kBF16, {512, 5120});
  expect("layers.20.attn.compressor.wkv.weight", Dtype::kBF16, {512, 5120});
  expect("layers.20.attn.indexer.wk.weight", Dtype::kBF16, {128, 512});
  expect("layers.24.attn.indexer.wq_b.scale", Dtype::kF8E8M0, {128, 40});
  expect("layers.24.attn.indexer.weights_proj.weight", Dtype::kBF16, {32, 5120});
  expect("layers.5.ffn.experts.7.w1.weight", Dtype::kI8, {2304, 2560});
  expect("layers.5.ffn.experts.7.w1.scale", Dtype::kF8E8M0, {2304, 160});
  expect("layers.5.ffn.experts.7.w2.weight", Dtype::kI8, {5120, 1152});
  expect("layers.5.ffn.experts.7.w2.scale", Dtype::kF8E8M0, {5120, 72});
  expect("layers.5.ffn.shared_experts.w1.scale", Dtype::kF8E8M0, {72, 160});
  expect("layers.5.ffn.shared_experts.w2.scale", Dtype::kF8E8M0, {160, 72});
  expect("layers.1.engram.embed.weight", Dtype::kF8E4M3, {384006168, 256});
  expect("layers.14.engram.embed.scale", Dtype::kF8E8M0, {384016682, 8});
  expect("layers.1.engram.wkv.scale", Dtype::kF8E8M0, {800, 192});
  expect("mtp.0.main_proj.scale", Dtype::kF8E8M0, {160, 480});
  expect("mtp.2.confidence_head.proj.weight", Dtype::kBF16, {1, 5376});
  expect("mtp.1.ffn.gate.weight", Dtype::kBF16, {128, 5120});
  EXPECT_FALSE(by.count("layers.3.attn.compressor.wkv.weight"));  // Reuse layers own no compressor
  EXPECT_FALSE(by.count("layers.25.attn.indexer.wq_b.weight"));
  EXPECT_FALSE(by.count("layers.24.attn.indexer.wk.weight"));     // Reindex borrows index keys
  EXPECT_FALSE(by.count("mtp.0.attn.compressor.wkv.weight"));
}

}  // namespace
}  // namespace cedar::model
