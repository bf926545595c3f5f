// Test helper: runs a body once per Highway target that is both compiled in and supported by this CPU,
// with dispatch forced to that target.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "hwy/targets.h"
#include "ops/simd_info.h"

namespace cedar::ops::testing {

template <typename Fn>
void for_each_simd_target(Fn&& fn) {
  const auto targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(target));
    ASSERT_EQ(dispatched_simd_target(), hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the real CPU
}

}  // namespace cedar::ops::testing
