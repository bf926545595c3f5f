// The op registry in correctness mode (harness/op_registry.h, docs/OPS.md): every case that is not
// perf-only, on every SIMD target and x86 form it reaches, inline and on a pool; one test per case,
// named after it (so --gtest_filter='*linear_fp8*' picks cases as ops_harness --filter does).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <memory>
#include <set>
#include <string>

#include "core/thread_pool.h"
#include "harness/op_registry.h"
#include "harness/op_rng.h"

namespace cedar::ops::testing {
namespace {

class OpRegistry : public ::testing::TestWithParam<const OpCase*> {};

TEST_P(OpRegistry, WithinItsBoundOnEveryTargetAndForm) {
  ThreadPool pool(3);
  for (const std::string& failure : check_case(*GetParam(), &pool)) ADD_FAILURE() << failure;
}

std::vector<const OpCase*> correctness_cases() {
  std::vector<const OpCase*> out;
  for (const OpCase& c : op_cases())
    if (!c.perf_only) out.push_back(&c);
  return out;
}

// "linear_fp8 m=1 k=4096 n=1024" -> "linear_fp8_m1_k4096_n1024" (gtest names are identifiers).
std::string test_name(const ::testing::TestParamInfo<const OpCase*>& info) {
  std::string s;
  for (char ch : info.param->name) {
    if (ch == ' ') {
      s += '_';
    } else if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') {
      s += ch;
    }
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(Cases, OpRegistry, ::testing::ValuesIn(correctness_cases()), test_name);

TEST(OpRegistry, NamesAreUniqueAndEveryOpHasAReleasedShape) {
  std::set<std::string> names, ops, released;
  for (const OpCase& c : op_cases()) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case name " << c.name;
    EXPECT_EQ(c.name.rfind(c.op, 0), 0u) << c.name << " does not start with its op " << c.op;
    EXPECT_GT(c.bytes, 0) << c.name;
    EXPECT_GT(c.flops, 0) << c.name;
    ops.insert(c.op);
    if (c.released && !c.perf_only) released.insert(c.op);
  }
  // No V4.1 weight is stored as f32, so linear_f32 has no released shape.
  for (const std::string& op : ops)
    if (op != "linear_f32") { EXPECT_TRUE(released.count(op)) << op << " has no released shape in the sweep"; }
}

TEST(OpRegistry, GuardsCatchWritesOutsideTheOutput) {
  GuardedFloats g(10);
  EXPECT_TRUE(g.guards_intact());
  g.data()[9] = 1.0f;
  EXPECT_TRUE(g.guards_intact());
  g.data()[10] = 1.0f;  // one past the end: the first guard word after the output
  EXPECT_FALSE(g.guards_intact());
  GuardedFloats h(10);
  h.data()[-1] = 1.0f;
  EXPECT_FALSE(h.guards_intact());
}

// A stand-in op whose output is its reference with one defect, to show each check fails it.
class Defective : public PreparedCase {
 public:
  enum Defect { kNone, kOneUlp, kUnwritten, kPastTheEnd, kOnThePool };
  explicit Defective(Defect d) : defect_(d) {
    want = {1.0f, -2.5f, 3.0f, 0.0f};
    out = GuardedFloats(want.size());
    fast_bound.assign(want.size(), 0.0);
  }
  void run(const KernelSet&, ThreadPool* pool) override {
    for (size_t i = 0; i < want.size(); ++i)
      if (!(defect_ == kUnwritten && i == 2)) out.data()[i] = want[i];
    if (defect_ == kOneUlp) out.data()[1] = std::nextafter(want[1], 0.0f);
    if (defect_ == kPastTheEnd) out.data()[want.size()] = 0.0f;
    if (defect_ == kOnThePool && pool != nullptr) out.data()[3] = -0.0f;  // equal as a float, not as bits
  }

 private:
  Defect defect_;
};

TEST(OpRegistry, ChecksFailWrongOutputs) {
  const auto run_check = [](Defective::Defect d, Numerics mode) {
    Defective c(d);
    c.out.poison();
    c.run(kernel_set(mode), nullptr);
    return c.out.guards_intact() ? c.check(mode) : std::string("guards");
  };
  for (Numerics mode : {Numerics::kExact, Numerics::kFast}) {
    EXPECT_EQ(run_check(Defective::kNone, mode), "");
    EXPECT_NE(run_check(Defective::kOneUlp, mode), "");     // fast: the bound is 0 here
    EXPECT_NE(run_check(Defective::kUnwritten, mode), "");  // the poison NaN is left
    EXPECT_EQ(run_check(Defective::kPastTheEnd, mode), "guards");
  }
  // The runner: the defects above and a thread-count dependence, on every target.
  ThreadPool pool(2);
  for (auto d : {Defective::kNone, Defective::kOneUlp, Defective::kPastTheEnd, Defective::kOnThePool}) {
    OpCase c;
    c.name = "defective";
    c.numerics = {Numerics::kExact};
    c.prepare = [d](const PrepareOptions&) { return std::make_unique<Defective>(d); };
    const auto failures = check_case(c, &pool);
    if (d == Defective::kNone) {
      EXPECT_TRUE(failures.empty());
    } else {
      ASSERT_FALSE(failures.empty()) << d;
      EXPECT_NE(failures[0].find(d == Defective::kPastTheEnd  ? "outside"
                                 : d == Defective::kOnThePool ? "thread count"
                                                              : "@1"),
                std::string::npos)
          << failures[0];
    }
  }
}

TEST(OpRegistry, PortableRngGivesTheSameNumbersEverywhere) {
  // SplitMix64's published first outputs for seed 0 (and so the same on every machine).
  PortableRng rng(0);
  EXPECT_EQ(rng(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(rng(), 0x6E789E6AA1B965F4ull);
  PortableRng a(seed_of("linear_fp8 m=1 k=4096 n=1024")), b(seed_of("linear_fp8 m=1 k=4096 n=1024"));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.normal(0.0f, 2.0f), b.normal(0.0f, 2.0f));
  // The normal draws have mean 0 and variance 1 to within sampling error.
  double sum = 0, sum2 = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double z = rng.normal();
    sum += z;
    sum2 += z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(sum2 / n, 1.0, 0.02);
}

}  // namespace
}  // namespace cedar::ops::testing
