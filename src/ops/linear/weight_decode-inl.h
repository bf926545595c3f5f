// Per-target (Highway) decoders of FP8 E4M3 and packed FP4 E2M1 weight blocks, shared by the exact
// (linear_exact.cc) and fast (linear_fast.cc) kernels. Include inside a file compiled through
// foreach_target.h, after "hwy/highway.h".
#if defined(CEDAR_OPS_WEIGHT_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CEDAR_OPS_WEIGHT_DECODE_INL_H_
#undef CEDAR_OPS_WEIGHT_DECODE_INL_H_
#else
#define CEDAR_OPS_WEIGHT_DECODE_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Weights are decoded and multiplied by the activations in fp32 vectors of up to 16 lanes (every
// product is exact), the products are promoted to f64 in two halves and summed (exact in any order,
// see linear_internal.h). HWY_SCALAR has one lane and promotes directly.
using DW = hn::CappedTag<float, 16>;
using VW = hn::Vec<DW>;
constexpr size_t kMaxVecPerBlock = 32;  // 32 elements / 1 lane (HWY_SCALAR)

// N E4M3 codes -> f32 value * 2^-8, exactly: the code's exponent and mantissa bits are moved into the
// low exponent bits and top mantissa bits of an IEEE half (bias 15 instead of 7, so normal and
// subnormal codes both become value * 2^-8), which the hardware widens to f32. All results and all
// products with E4M3 activations stay normal f32 numbers (subnormal operands would cost microcode
// assists on x86). Codes 0x7F/0xFF (E4M3 NaN) decode as +-480 * 2^-8: checkpoints contain none.
HWY_INLINE VW DecodeE4m3Over256(DW df, const uint8_t* p) {
  const hn::Rebind<int8_t, DW> d8;
  const hn::Rebind<int16_t, DW> d16;
  const hn::Rebind<hwy::float16_t, DW> dhalf;
  // Sign-extending the code and shifting left by 7 puts the sign at bit 15 and the 7 value bits at
  // 13..7; bit 14 (a copy of the sign) is cleared by the mask.
  const auto code = hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const int8_t*>(p)));
  const auto bits = hn::And(hn::ShiftLeft<7>(code), hn::Set(d16, static_cast<int16_t>(0xBF80)));
  return hn::PromoteTo(df, hn::BitCast(dhalf, bits));
}
constexpr double kE4m3Unscale = 256.0;

// 2 x E2M1 value of every 4-bit code (bit 3 = sign): 0, 1, 2, 3, 4, 6, 8, 12 and their negatives.
alignas(16) constexpr int8_t kE2m1Twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
constexpr double kE2m1Unscale = 0.5;

// Decodes one 32-weight block (FP8: 32 code bytes; FP4: 16 packed bytes, even element in the low
// nibble) into 32/N vectors of N lanes, exactly: E4M3 as value * 2^-8, E2M1 as 2 * value.
template <bool kFp4>
HWY_INLINE void DecodeBlock(const uint8_t* src, VW* wv) {
  const DW df;
  const size_t lanes = hn::Lanes(df);
  if constexpr (kFp4) {
    HWY_ALIGN int8_t twice[32];  // [32] 2 * value in element order
#if HWY_TARGET == HWY_SCALAR
    for (size_t i = 0; i < 32; ++i) twice[i] = kE2m1Twice[(src[i / 2] >> (4 * (i & 1))) & 0xF];
#else
    // Split the 16 bytes into low and high nibbles, interleave them back into element order and look
    // the codes up in the byte table.
    const hn::Full128<uint8_t> d16;
    const hn::Full128<int8_t> di16;
    const auto packed = hn::LoadU(d16, src);
    const auto lo = hn::And(packed, hn::Set(d16, uint8_t{0x0F}));
    const auto hi = hn::ShiftRight<4>(packed);
    const auto table = hn::Load(di16, kE2m1Twice);
    const auto first = hn::TableLookupBytes(table, hn::BitCast(di16, hn::InterleaveLower(d16, lo, hi)));
    const auto second = hn::TableLookupBytes(table, hn::BitCast(di16, hn::InterleaveUpper(d16, lo, hi)));
#if HWY_TARGET <= HWY_AVX3
    // 16 lanes: widen the two byte vectors directly.
    const hn::RebindToSigned<DW> di32;
    wv[0] = hn::ConvertTo(df, hn::PromoteTo(di32, first));
    wv[1] = hn::ConvertTo(df, hn::PromoteTo(di32, second));
    return;
#else
    hn::Store(first, di16, twice);
    hn::Store(second, di16, twice + 16);
#endif
#endif
    const hn::Rebind<int8_t, DW> d8;
    const hn::RebindToSigned<DW> di;
    for (size_t g = 0; g < 32 / lanes; ++g) {
      wv[g] = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, twice + lanes * g)));
    }
  } else {
    for (size_t g = 0; g < 32 / lanes; ++g) wv[g] = DecodeE4m3Over256(df, src + lanes * g);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
