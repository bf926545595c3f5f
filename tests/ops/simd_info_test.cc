// Target reporting, and a check that the per-target test loop really switches targets.
#include "ops/simd/simd_info.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "simd_targets.h"

namespace cedar::ops {
namespace {

TEST(SimdInfo, DispatchedTargetIsSupportedAndCompiled) {
  const auto compiled = compiled_simd_targets();
  const auto supported = supported_simd_targets();
  ASSERT_FALSE(compiled.empty());
  ASSERT_FALSE(supported.empty());
  std::string line = "compiled:";
  for (const auto& c : compiled) line += " " + c;
  line += " | supported here:";
  for (const auto& s : supported) line += " " + s;
  line += " | dispatched: " + dispatched_simd_target();
  std::printf("%s\n", line.c_str());
  RecordProperty("simd_targets", line);
  EXPECT_NE(std::find(supported.begin(), supported.end(), dispatched_simd_target()), supported.end());
  for (const auto& s : supported) {
    EXPECT_NE(std::find(compiled.begin(), compiled.end(), s), compiled.end()) << s;
  }
}

TEST(SimdInfo, TargetLoopVisitsEverySupportedTarget) {
  std::set<std::string> seen;
  testing::for_each_simd_target([&] { seen.insert(dispatched_simd_target()); });
  EXPECT_EQ(seen.size(), supported_simd_targets().size());
  EXPECT_EQ(dispatched_simd_target(), supported_simd_targets().front());  // restored afterwards
}

}  // namespace
}  // namespace cedar::ops
