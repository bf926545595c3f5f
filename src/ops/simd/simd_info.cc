// Highway target reporting (simd_info.h).
#include "ops/simd/simd_info.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/simd/simd_info.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/targets.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
int64_t ThisTarget() { return HWY_TARGET; }
}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {
HWY_EXPORT(ThisTarget);

std::string dispatched_simd_target() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(ThisTarget)()); }

std::vector<std::string> compiled_simd_targets() {
  std::vector<std::string> names;
  for (int64_t t = 1; t != 0 && t <= HWY_TARGETS; t <<= 1) {
    if (HWY_TARGETS & t) names.emplace_back(hwy::TargetName(t));
  }
  return names;
}

std::vector<std::string> supported_simd_targets() {
  std::vector<std::string> names;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) names.emplace_back(hwy::TargetName(t));
  return names;
}

}  // namespace cedar::ops
#endif  // HWY_ONCE
