// Highway decoders of the packed KV formats (quant.h). A decode step reads the whole FP8 window of
// every layer (V4.1: 128 entries of 512 values per layer) and the FP4 compressed entries each query
// selected (up to 512 per layer), all on the calling thread between parallel regions, so the scalar
// table loops of the reference were a visible serial part of decode.
//
// The codes are decoded arithmetically, not looked up: decode's window decoder as a gather from the
// 256-entry table took about 3 ns per value on Zen 4 (a profile of 2-thread decode; the performance
// log, `git show f6bfcca:docs/PERFORMANCE_LOG.md`).
// Every code's value is built exactly (the format's exponent moved into f32's, subnormals from an
// exact integer conversion, the table's NaN for NaN codes), then multiplied by the block's scale in
// f32 with the reference's operand order: the bits are the reference's on every target, NaN included.
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "ops/formats/formats.h"
#include "ops/formats/quant.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/formats/quant_exact.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// E4M3 codes (one per u32 lane) -> their exact f32 values (the e4m3 table's bits).
// `nan`: the table's value of the NaN codes.
template <class DF, class VU>
HWY_INLINE hn::Vec<DF> DecodeE4m3(DF df, VU code, hn::Vec<DF> nan) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto mag = hn::And(code, hn::Set(du, 0x7Fu));
  const auto sign = hn::ShiftLeft<24>(hn::And(code, hn::Set(du, 0x80u)));
  // Normal codes: exponent e (bias 7) -> f32 exponent e + 120, mantissa m -> bits 22..20.
  const auto normal = hn::BitCast(df, hn::Add(hn::ShiftLeft<20>(mag), hn::Set(du, 120u << 23)));
  // Exponent 0: m · 2^-9 (m <= 7, the conversion and the product are exact).
  const auto sub = hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mag)), hn::Set(df, 1.0f / 512.0f));
  const auto value = hn::IfThenElse(hn::RebindMask(df, hn::Lt(mag, hn::Set(du, 8u))), sub, normal);
  return hn::IfThenElse(hn::RebindMask(df, hn::Eq(mag, hn::Set(du, 0x7Fu))), nan, hn::Or(value, hn::BitCast(df, sign)));
}

// E2M1 codes (one nibble per u32 lane, upper bits clear) -> their exact f32 values.
template <class DF, class VU>
HWY_INLINE hn::Vec<DF> DecodeE2m1(DF df, VU code) {
  const hn::RebindToUnsigned<DF> du;
  const auto mag = hn::And(code, hn::Set(du, 7u));
  const auto sign = hn::ShiftLeft<28>(hn::And(code, hn::Set(du, 8u)));
  // Exponent e >= 1 (bias 1) -> f32 exponent e + 126, mantissa bit -> bit 22; exponent 0: 0 or 0.5.
  const auto normal = hn::Add(hn::ShiftLeft<22>(mag), hn::Set(du, 126u << 23));
  const auto small = hn::IfThenElseZero(hn::Eq(mag, hn::Set(du, 1u)), hn::Set(du, 0x3F000000u));  // 0.5
  const auto bits = hn::IfThenElse(hn::Lt(mag, hn::Set(du, 2u)), small, normal);
  return hn::BitCast(df, hn::Or(bits, sign));
}

void Fp8DequantE8m0(const uint8_t* codes, const uint8_t* scales_e8m0, size_t n, float* x, size_t block) {
  const float* table = e4m3_table();
  const float* scale_table = e8m0_table();
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint8_t, decltype(df)> d8;  // one code byte per float lane
  const size_t N = hn::Lanes(df);
  const auto nan = hn::Set(df, table[0x7F]);
  for (size_t b = 0; b < n / block; ++b) {
    const float s = scale_table[scales_e8m0[b]];
    const auto vs = hn::Set(df, s);
    const size_t end = (b + 1) * block;
    size_t i = b * block;
    for (; i + N <= end; i += N) {
      const auto value = DecodeE4m3(df, hn::PromoteTo(du, hn::LoadU(d8, codes + i)), nan);
      hn::StoreU(hn::Mul(value, vs), df, x + i);
    }
    for (; i < end; ++i) x[i] = table[codes[i]] * s;
  }
}

// FP4 (E2M1, the even element in a byte's low nibble) with one scale per block, already decoded.
// Eight lanes (16 values, the E4M3-scaled entries' block) per step: a block of 16 or 32 is whole steps.
template <class ScaleOf>
HWY_INLINE void Fp4Dequant(const uint8_t* packed, size_t n, float* x, size_t block, const ScaleOf& scale_of) {
  const float* pairs = fp4_pair_table();  // the tails
  const hn::CappedTag<float, 8> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const size_t N = hn::Lanes(df);
  for (size_t b = 0; b < n / block; ++b) {
    const float s = scale_of(b);
    const auto vs = hn::Set(df, s);
    const size_t end = (b + 1) * block;
    size_t i = b * block;
    for (; i + 2 * N <= end; i += 2 * N) {
      const auto bytes = hn::PromoteTo(du, hn::LoadU(d8, packed + i / 2));
      const auto even = DecodeE2m1(df, hn::And(bytes, hn::Set(du, 0xFu)));
      const auto odd = DecodeE2m1(df, hn::ShiftRight<4>(bytes));
      hn::StoreInterleaved2(hn::Mul(even, vs), hn::Mul(odd, vs), df, x + i);
    }
    for (; i < end; i += 2) {
      const float* pair = pairs + 2 * packed[i / 2];
      x[i] = pair[0] * s;
      x[i + 1] = pair[1] * s;
    }
  }
}

void Fp4DequantE4m3(const uint8_t* packed, const uint8_t* scales_e4m3, size_t n, float* x, size_t block) {
  const float* scale_table = e4m3_table();
  Fp4Dequant(packed, n, x, block, [&](size_t b) { return scale_table[scales_e4m3[b]]; });
}
void Fp4DequantE8m0(const uint8_t* packed, const uint8_t* scales_e8m0, size_t n, float* x, size_t block) {
  const float* scale_table = e8m0_table();
  Fp4Dequant(packed, n, x, block, [&](size_t b) { return scale_table[scales_e8m0[b]]; });
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {

HWY_EXPORT(Fp8DequantE8m0);
HWY_EXPORT(Fp4DequantE4m3);
HWY_EXPORT(Fp4DequantE8m0);

void fp8_dequant_e8m0(const uint8_t* codes, const uint8_t* scales_e8m0, size_t n, float* x, size_t block) {
  CEDAR_CHECK(block > 0 && n % block == 0, "fp8_dequant_e8m0: length %zu is not a multiple of the block %zu", n,
              block);
  HWY_DYNAMIC_DISPATCH(Fp8DequantE8m0)(codes, scales_e8m0, n, x, block);
}

void fp4_dequant_e4m3(const uint8_t* packed, const uint8_t* scales_e4m3, size_t n, float* x, size_t block) {
  CEDAR_CHECK(block > 0 && block % 2 == 0 && n % block == 0,
              "fp4_dequant_e4m3: length %zu is not a multiple of the even block %zu", n, block);
  HWY_DYNAMIC_DISPATCH(Fp4DequantE4m3)(packed, scales_e4m3, n, x, block);
}

void fp4_dequant_e8m0(const uint8_t* packed, const uint8_t* scales_e8m0, size_t n, float* x, size_t block) {
  CEDAR_CHECK(block > 0 && block % 2 == 0 && n % block == 0,
              "fp4_dequant_e8m0: length %zu is not a multiple of the even block %zu", n, block);
  HWY_DYNAMIC_DISPATCH(Fp4DequantE8m0)(packed, scales_e8m0, n, x, block);
}

}  // namespace cedar::ops
#endif  // HWY_ONCE
