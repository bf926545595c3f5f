// The expert placement: by id without statistics, balanced by routing counts with them, never more
// than ceil(E / N) experts per rank and layer; the sidecar reader refuses another model's file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dist/placement.h"

namespace cedar::dist {
namespace {

TEST(ExpertPlacement, ByIdDealsRoundRobin) {
  const std::vector<int> per_layer = {8, 8};
  const ExpertPlacement p = place_experts(per_layer, 3, {});
  EXPECT_FALSE(p.from_stats);
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 8; ++e) EXPECT_EQ(p.owner_of(l, e), e % 3) << "layer " << l << " expert " << e;
}

TEST(ExpertPlacement, StatsSpreadTheHeaviestExperts) {
  // Layer 0: experts 0 and 1 carry almost all the load; by id they would share rank 0 with 2 ranks
  // of 4 experts each... by load they must land on different ranks.
  const std::vector<int> per_layer = {4};
  const std::vector<uint32_t> load = {1000, 900, 1, 1};
  const ExpertPlacement p = place_experts(per_layer, 2, load);
  EXPECT_TRUE(p.from_stats);
  EXPECT_NE(p.owner_of(0, 0), p.owner_of(0, 1));
  int on_zero = 0;
  for (int e = 0; e < 4; ++e) on_zero += p.owner_of(0, e) == 0;
  EXPECT_EQ(on_zero, 2);  // the cap: ceil(4 / 2) experts per rank
}

TEST(ExpertPlacement, CapHoldsWithSkewedLoad) {
  const std::vector<int> per_layer = {7};
  const std::vector<uint32_t> load = {500, 400, 300, 200, 100, 50, 10};
  const ExpertPlacement p = place_experts(per_layer, 3, load);
  std::vector<int> count(3);
  for (int e = 0; e < 7; ++e) count[p.owner_of(0, e)] += 1;
  for (int r = 0; r < 3; ++r) EXPECT_LE(count[r], 3) << "rank " << r;
  EXPECT_EQ(count[0] + count[1] + count[2], 7);
}

TEST(ExpertPlacement, SidecarOfAnotherModelIsIgnored) {
  const std::string path = (std::filesystem::temp_directory_path() / "cedar_dist_stats_test").string();
  auto write = [&](uint32_t layers, uint32_t experts, size_t counts) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write("CEDRST01", 8);
    out.write(reinterpret_cast<const char*>(&layers), 4);
    out.write(reinterpret_cast<const char*>(&experts), 4);
    for (size_t i = 0; i < counts; ++i) {
      const uint32_t v = static_cast<uint32_t>(i + 1);
      out.write(reinterpret_cast<const char*>(&v), 4);
    }
  };
  const std::vector<int> per_layer = {4, 4};
  write(2, 8, 8);
  const std::vector<uint32_t> ok = read_expert_stats(path, per_layer);
  ASSERT_EQ(ok.size(), 8u);
  EXPECT_EQ(ok[7], 8u);
  write(3, 8, 8);  // another layer count
  EXPECT_TRUE(read_expert_stats(path, per_layer).empty());
  write(2, 6, 6);  // another expert count
  EXPECT_TRUE(read_expert_stats(path, per_layer).empty());
  std::filesystem::remove(path);
  EXPECT_TRUE(read_expert_stats(path, per_layer).empty());
}

}  // namespace
}  // namespace cedar::dist
