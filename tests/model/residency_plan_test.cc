// The residency planner on the released config: expert and row sizes from the tensor shapes worked
// out by hand, and the plan's invariants at 64 / 128 / 256 / 512 GiB.
#include <gtest/gtest.h>

#include "weights/residency_plan.h"
#include "spec/weight_inventory.h"

namespace cedar::model {
namespace {

struct Released {
  ModelConfig c;
  LayerPlan plan;
  ParamCounts counts;
};

Released released() {
  auto c = load_config(std::string(CEDAR_SOURCE_DIR) + "/configs/deepseek-v4.1-flash.json");
  if (!c.ok()) throw std::runtime_error(c.status().to_string());
  Released r{*c, make_layer_plan(*c), {}};
  r.counts = count_params(weight_inventory(r.c));
  return r;
}

TEST(ResidencyPlan, SizesOfOneExpertAndOneRow) {
  const Released r = released();
  // w1 and w3: [2304, 5120/2] packed E2M1 + [2304, 5120/32] E8M0 = 5,898,240 + 368,640 bytes;
  // w2: [5120, 2304/2] + [5120, 2304/32] = 5,898,240 + 368,640 bytes.
  EXPECT_EQ(routed_expert_bytes(r.c), 3 * (5898240 + 368640));
  // Engram: 256 E4M3 codes + 8 E8M0 scales per row.
  EXPECT_EQ(engram_row_bytes(r.c), 264);
}

TEST(ResidencyPlan, BudgetsFromSmallToLarge) {
  const Released r = released();
  double last_decode = 1e30;
  int64_t last_slots = -1;
  for (uint64_t gib : {64, 128, 256}) {
    auto p = plan_residency(r.c, r.plan, r.counts, gib << 30);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_TRUE(p->streaming);
    EXPECT_LE(p->resident_total(), static_cast<int64_t>(gib << 30));
    EXPECT_GT(p->expert_slots, last_slots);
    EXPECT_LT(p->expert_slots, 40 * 384);
    EXPECT_LT(p->ssd_bytes_per_decode_token, last_decode);
    // A chunk reads each expert at most once, so a prefill token never costs more than a decode token.
    EXPECT_LE(p->ssd_bytes_per_prefill_token, p->ssd_bytes_per_decode_token);
    last_decode = p->ssd_bytes_per_decode_token;
    last_slots = p->expert_slots;
  }
  auto big = plan_residency(r.c, r.plan, r.counts, uint64_t{512} << 30);
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE(big->streaming);  // 475 GiB on disk, of which DSpark and vision are never read
}

TEST(ResidencyPlan, TooSmallNamesTheSmallestBudget) {
  const Released r = released();
  auto p = plan_residency(r.c, r.plan, r.counts, uint64_t{8} << 30);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("raise --memory-budget to at least"), std::string::npos);
}

// The budget the error names is one that plans (the workspace reserve grows with the budget, so it is
// more than the sum of the parts at the failed budget), and one unit less fails naming the same.
TEST(ResidencyPlan, TheNamedBudgetWorks) {
  const Released r = released();
  auto named = [&](uint64_t budget, const ResidencyPlanOptions& o) -> uint64_t {
    auto p = plan_residency(r.c, r.plan, r.counts, budget, o);
    if (p.ok()) return 0;
    const std::string m = p.status().message(), key = "raise --memory-budget to at least ";
    const size_t at = m.find(key);
    if (at == std::string::npos) return 0;
    auto size = parse_size(m.substr(at + key.size()), "--memory-budget");
    return size.ok() ? *size : 0;
  };
  for (bool coded : {true, false}) {
    for (uint64_t kv : {uint64_t{0}, uint64_t{3} << 30, uint64_t{700} << 20}) {
      ResidencyPlanOptions o;
      o.coded_head = coded;
      o.kv_reserve_bytes = kv;
      const uint64_t works = named(uint64_t{1} << 30, o);
      ASSERT_GT(works, 0u) << coded << " " << kv;
      EXPECT_EQ(named(works / 2, o), works);
      auto p = plan_residency(r.c, r.plan, r.counts, works, o);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      EXPECT_LE(p->resident_total(), static_cast<int64_t>(works));
      EXPECT_GE(p->expert_slots, r.plan.layers[0].n_activated_experts);  // one token's experts of a layer
      const uint64_t unit = works % (uint64_t{1} << 30) == 0 ? uint64_t{1} << 30 : uint64_t{1} << 20;
      EXPECT_EQ(named(works - unit, o), works);
    }
  }
}

TEST(ResidencyPlan, FastNumericsCountTheReCodedHead) {
  const Released r = released();
  // head [129280, 5120]: 5120 · 1.5 bytes per row, a 16-byte table per row, 129,281 row offsets.
  const int64_t coded = int64_t{129280} * 7680 + 129280 * 16 + 129281 * 4;
  ResidencyPlanOptions exact;
  exact.coded_head = false;
  EXPECT_EQ(resident_plan(r.c, r.plan, r.counts).coded_head_bytes, coded);
  EXPECT_EQ(resident_plan(r.c, r.plan, r.counts, exact).coded_head_bytes, 0);
  auto fast_plan = plan_residency(r.c, r.plan, r.counts, uint64_t{64} << 30);
  auto exact_plan = plan_residency(r.c, r.plan, r.counts, uint64_t{64} << 30, exact);
  ASSERT_TRUE(fast_plan.ok() && exact_plan.ok());
  EXPECT_LE(fast_plan->resident_total(), int64_t{64} << 30);
  // The head's bytes come out of the expert slab.
  EXPECT_LT(fast_plan->expert_slots, exact_plan->expert_slots);
  EXPECT_GE(exact_plan->expert_slab_bytes - fast_plan->expert_slab_bytes, coded - fast_plan->expert_slot);
}

TEST(ResidencyPlan, ParseSize) {
  EXPECT_EQ(*parse_size("64G", "--memory-budget"), uint64_t{64} << 30);
  EXPECT_EQ(*parse_size("512M", "--memory-budget"), uint64_t{512} << 20);
  EXPECT_EQ(*parse_size("64GB", "--memory-budget"), uint64_t{64} << 30);
  EXPECT_EQ(*parse_size("4096", "--memory-budget"), 4096u);
  EXPECT_FALSE(parse_size("lots", "--memory-budget").ok());
  EXPECT_FALSE(parse_size("0", "--memory-budget").ok());
  EXPECT_FALSE(parse_size("12Q", "--memory-budget").ok());
}

}  // namespace
}  // namespace cedar::model
