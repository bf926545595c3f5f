// Per-target (Highway) bf16 rounding of fp32 vectors, bit for bit what formats.h's round_bf16 does:
// round to nearest even (add 0x7FFF plus the lowest kept bit, clear the low half), NaN made quiet
// (bit 22 set) and truncated. Include inside a file compiled through foreach_target.h.
#if defined(CEDAR_OPS_BF16_ROUND_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CEDAR_OPS_BF16_ROUND_INL_H_
#undef CEDAR_OPS_BF16_ROUND_INL_H_
#else
#define CEDAR_OPS_BF16_ROUND_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Finite inputs only (callers guarantee no NaN): the rounding without the NaN select.
template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE VF RoundBf16Finite(DF df, VF x) {
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, x);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  return hn::BitCast(df, hn::And(hn::Add(u, hn::Add(hn::Set(du, 0x7FFFu), lsb)), hn::Set(du, 0xFFFF0000u)));
}

template <class DF, class VF = hn::Vec<DF>>
HWY_INLINE VF RoundBf16(DF df, VF x) {
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, x);
  const auto quiet_nan = hn::And(hn::Or(u, hn::Set(du, 0x00400000u)), hn::Set(du, 0xFFFF0000u));
  const auto is_nan = hn::Gt(hn::And(u, hn::Set(du, 0x7FFFFFFFu)), hn::Set(du, 0x7F800000u));
  return hn::IfThenElse(hn::RebindMask(df, is_nan), hn::BitCast(df, quiet_nan), RoundBf16Finite(df, x));
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#endif  // include guard
