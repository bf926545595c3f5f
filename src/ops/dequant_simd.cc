// Highway decoding of the FP8 window KV (quant.h fp8_dequant_e8m0). A decode step reads the whole
// window of every layer (V4.1: 128 entries of 512 values per layer), so the scalar table loop of the
// reference was a visible serial part of decode. Each code is looked up in the same E4M3 table by a
// gather and multiplied by the block's scale in f32, exactly the reference's two operations: the
// bits are the reference's on every target.
#include <cstddef>
#include <cstdint>

#include "core/check.h"
#include "ops/formats.h"
#include "ops/quant.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/dequant_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void Fp8DequantE8m0(const uint8_t* codes, const uint8_t* scales_e8m0, size_t n, float* x, size_t block) {
  const float* table = e4m3_table();
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;  // one code byte per float lane
  const size_t N = hn::Lanes(df);
  for (size_t b = 0; b < n / block; ++b) {
    const float s = e8m0_to_f32(scales_e8m0[b]);
    const auto vs = hn::Set(df, s);
    const size_t end = (b + 1) * block;
    size_t i = b * block;
    for (; i + N <= end; i += N) {
      const auto index = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<decltype(df)>(), hn::LoadU(d8, codes + i)));
      hn::StoreU(hn::Mul(hn::GatherIndex(df, table, index), vs), df, x + i);
    }
    for (; i < end; ++i) x[i] = table[codes[i]] * s;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {

HWY_EXPORT(Fp8DequantE8m0);

void fp8_dequant_e8m0(const uint8_t* codes, const uint8_t* scales_e8m0, size_t n, float* x, size_t block) {
  CEDAR_CHECK(block > 0 && n % block == 0, "fp8_dequant_e8m0: length %zu is not a multiple of the block %zu", n,
              block);
  HWY_DYNAMIC_DISPATCH(Fp8DequantE8m0)(codes, scales_e8m0, n, x, block);
}

}  // namespace cedar::ops
#endif  // HWY_ONCE
