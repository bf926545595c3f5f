#include "ops/attention/softmax_fast.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/formats/formats.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/attention/softmax_fast.cc"
// foreach_target must come first (clang-format would sort it after contrib/).
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "ops/simd/bf16_round-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float SoftmaxRowBf16(float* s, size_t n, float scale) {
  const hn::ScalableTag<float> df;
  const size_t lanes = hn::Lanes(df);
  const auto vscale = hn::Set(df, scale);
  float max_value = -std::numeric_limits<float>::infinity();
  size_t j = 0;
  if (n >= lanes) {
    auto vmax = hn::Set(df, max_value);
    for (; j + lanes <= n; j += lanes) vmax = hn::Max(vmax, hn::Mul(hn::LoadU(df, s + j), vscale));
    max_value = hn::GetLane(hn::MaxOfLanes(df, vmax));
  }
  for (; j < n; ++j) max_value = std::max(max_value, s[j] * scale);
  const auto vmax = hn::Set(df, max_value);
  auto vsum = hn::Zero(df);
  j = 0;
  for (; j + lanes <= n; j += lanes) {
    const auto e = hn::Exp(df, hn::Sub(hn::Mul(hn::LoadU(df, s + j), vscale), vmax));
    vsum = hn::Add(vsum, e);
    hn::StoreU(RoundBf16(df, e), df, s + j);
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, vsum));
  for (; j < n; ++j) {
    const float e = std::exp(s[j] * scale - max_value);
    sum += e;
    s[j] = round_bf16(e);
  }
  return sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {
HWY_EXPORT(SoftmaxRowBf16);
namespace fast {
float softmax_row_bf16(float* s, size_t n, float scale) { return HWY_DYNAMIC_DISPATCH(SoftmaxRowBf16)(s, n, scale); }
}  // namespace fast
}  // namespace cedar::ops
#endif  // HWY_ONCE
