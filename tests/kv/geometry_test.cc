// Cache layout: entry sizes and per-token figures against the spec's hand-worked numbers (§5.1-§5.5).
#include "kv/geometry.h"

#include <gtest/gtest.h>

#include "kv/report.h"
#include "kv_test_util.h"
#include "ops/formats/quant.h"

namespace cedar::kv {
namespace {

using testing::dense67b_spec;
using testing::v41_spec;
using testing::v4_spec;

TEST(KvGeometry, V41EntrySizesMatchThePackedFormatsOfOps) {
  const ModelKvSpec s = v41_spec();
  EXPECT_EQ(main_entry_bytes(s), ops::kMainKvEntryBytes);      // 256 codes + 32 E4M3 scales
  EXPECT_EQ(index_entry_bytes(s), ops::kIndexKeyEntryBytes);   // 64 codes + 4 E8M0 scales
  EXPECT_EQ(window_entry_bytes(s), ops::kWindowKvEntryBytes);  // 512 E4M3 + 16 E8M0
  EXPECT_EQ(main_entry_bytes(s), 288u);
  EXPECT_EQ(index_entry_bytes(s), 68u);
  EXPECT_EQ(window_entry_bytes(s), 528u);
}

TEST(KvGeometry, V4AndDenseEntrySizesFollowTheSpec) {
  // FlashMLA MODEL1: 448 E4M3 + 64 bf16 + 7 E8M0 + 1 pad.
  EXPECT_EQ(main_entry_bytes(v4_spec()), 448u + 128u + 7u + 1u);
  EXPECT_EQ(index_entry_bytes(v4_spec()), 68u);
  // K and V, 8 heads x 128, bf16.
  EXPECT_EQ(main_entry_bytes(dense67b_spec()), 2u * 8u * 128u * 2u);
}

TEST(KvGeometry, V41OwnersAndSharing) {
  auto g = make_cache_geometry(v41_spec(), 256, 40);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_EQ(g->owners.size(), 4u);
  const int layers[4] = {2, 8, 14, 20}, ratios[4] = {2, 2, 2, 1};
  for (int o = 0; o < 4; ++o) {
    EXPECT_EQ(g->owners[o].layer, layers[o]);
    EXPECT_EQ(g->owners[o].ratio, ratios[o]);
    EXPECT_EQ(g->owners[o].entries_per_block, 256u / ratios[o]);
    EXPECT_EQ(g->owners[o].boundary_tail_bytes, 0u);  // no group pending at a block boundary
  }
  // Reuse / Reindex layers read their source's copy (spec §4.5).
  EXPECT_EQ(g->owner_of_layer[0], -1);
  EXPECT_EQ(g->owner_of_layer[7], 0);
  EXPECT_EQ(g->owner_of_layer[13], 1);
  EXPECT_EQ(g->owner_of_layer[19], 2);
  EXPECT_EQ(g->owner_of_layer[24], 3);
  EXPECT_EQ(g->owner_of_layer[39], 3);
  EXPECT_EQ(g->owner_of_layer[41], -1);
  EXPECT_EQ(g->n_window_layers, 43);
  EXPECT_EQ(g->n_backbone_window_layers, 40);
  // 890 B/token = 3 x (288 + 68) / 2 + (288 + 68) / 1 (spec §5.2), exactly, per 256-token block.
  EXPECT_EQ(g->block_bytes, 890u * 256u);
  EXPECT_EQ(g->block_main_bytes, 720u * 256u);
  EXPECT_EQ(g->block_index_bytes, 170u * 256u);
  // Ratio-2 tails: 2 slots x 512 fp32, kv and score.
  EXPECT_EQ(g->live_tail_bytes_per_sequence(), 3u * 2u * 2u * 512u * 4u);
  EXPECT_EQ(g->boundary_state_bytes, 3u * 8u);  // Engram history only
}

TEST(KvGeometry, ReportFiguresV41) {
  auto g = make_cache_geometry(v41_spec(), 256, 40);
  ASSERT_TRUE(g.ok());
  auto f = measure_footprint(*g, 1 << 20, /*persists_swa=*/false);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->global_bytes_per_token, 890.0);
  EXPECT_EQ(f->main_kv_bytes_per_token, 720.0);
  EXPECT_EQ(f->index_key_bytes_per_token, 170.0);
  EXPECT_EQ(f->global_bytes, 890ull << 20);  // 0.869 GiB
  EXPECT_NEAR(f->global_bytes / double(1ull << 30), 0.87, 0.005);
  EXPECT_EQ(f->swa_bytes_per_sequence, 43u * 128u * 528u);
  EXPECT_EQ(f->swa_backbone_bytes_per_sequence, 40u * 128u * 528u);
  // One block file = 128 header + 256 token ids + 24 boundary + 227,840 KV.
  EXPECT_EQ(f->block_file_bytes, 128u + 1024u + 24u + 890u * 256u);
  EXPECT_EQ(f->persisted_bytes_per_token, f->persisted_bytes_per_token_without_swa);
}

TEST(KvGeometry, ReportFiguresV4AndDense) {
  auto g4 = make_cache_geometry(v4_spec(), 256, 43);
  ASSERT_TRUE(g4.ok()) << g4.status().to_string();
  EXPECT_EQ(g4->owners.size(), 41u);
  auto f4 = measure_footprint(*g4, 1 << 20, /*persists_swa=*/true);
  ASSERT_TRUE(f4.ok());
  // 21 x (584 + 68) / 4 + 20 x 584 / 128 = 3423 + 91.25 (spec §5.3).
  EXPECT_DOUBLE_EQ(f4->global_bytes_per_token, 3514.25);
  EXPECT_NEAR(890.0 / f4->global_bytes_per_token, 0.253, 0.001);

  auto gd = make_cache_geometry(dense67b_spec(), 256);
  ASSERT_TRUE(gd.ok());
  auto fd = measure_footprint(*gd, 1 << 20, false);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  EXPECT_EQ(fd->global_bytes_per_token, 389120.0);  // 2 * 95 * 8 * 128 * 2 (spec §5.5)
  EXPECT_EQ(fd->swa_bytes_per_sequence, 0u);
  EXPECT_NEAR(fd->global_bytes_per_token / 890.0, 437.2, 0.05);
}

TEST(KvGeometry, PartialLastBlockIsCountedAsAllocated) {
  auto g = make_cache_geometry(v41_spec(), 256);
  ASSERT_TRUE(g.ok());
  auto f = measure_footprint(*g, 257, false);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->blocks_allocated, 2u);
  EXPECT_EQ(f->global_bytes, 2u * 890u * 256u);
}

TEST(KvGeometry, RejectsBadLayouts) {
  // HCA ratio 128 does not divide a 64-token block.
  auto g = make_cache_geometry(v4_spec(), 64);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("does not divide the block size"), std::string::npos);
  ModelKvSpec s = v41_spec();
  s.layers[5].kv_from = 6;  // not an owner
  EXPECT_FALSE(make_cache_geometry(s, 256).ok());
  s = v41_spec();
  s.layers[21].compress_ratio = 2;  // disagrees with its owner (ratio 1)
  EXPECT_FALSE(make_cache_geometry(s, 256).ok());
  s = v41_spec();
  s.layers.erase(s.layers.begin() + 3);  // gap in the layer list
  EXPECT_FALSE(make_cache_geometry(s, 256).ok());
  EXPECT_FALSE(make_cache_geometry(v41_spec(), 0).ok());
  EXPECT_FALSE(measure_footprint(make_cache_geometry(v41_spec(), 256).value(), 0, false).ok());
}

TEST(KvGeometry, FingerprintCoversModelAndLayout) {
  const auto a = make_cache_geometry(v41_spec(), 256).value();
  const auto b = make_cache_geometry(v41_spec(), 128).value();
  ModelKvSpec other = v41_spec();
  other.model_fingerprint = 42;
  const auto c = make_cache_geometry(other, 256).value();
  EXPECT_EQ(a.layout_fingerprint(), make_cache_geometry(v41_spec(), 256).value().layout_fingerprint());
  EXPECT_NE(a.layout_fingerprint(), b.layout_fingerprint());
  EXPECT_NE(a.layout_fingerprint(), c.layout_fingerprint());
}

}  // namespace
}  // namespace cedar::kv
