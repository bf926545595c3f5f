// The fast linear kernels of linear_fast.h: Highway kernels compiled for every enabled target and
// chosen at run time. Two shapes:
//   * GEMV (m < kFastGemmMinRows, decode): each weight block is decoded once into registers and
//     multiplied with up to four activation rows; per-block fp32 partials are scaled by the block's
//     power-of-two scale and accumulated in vector lanes, reduced once per output.
//   * GEMM (prefill): per thread, 16 weight rows x 256 K are decoded (scale applied, exact) into a
//     K-major panel that stays in L1, and a 6-row x 16-column register tile of fp32 accumulators
//     runs over it with one broadcast activation per row and K step (no horizontal reductions).
// This file: the block-scaled FP8 / FP4 weights and the activation quantisation; the dense bf16 / f32
// weights are in linear_fast_dense.cc, and what both use (the panel GEMM) in linear_fast-inl.h.
#include "ops/linear/linear_fast.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/linear/activation_access.h"
#include "ops/formats/formats.h"
#include "ops/linear/x86_fp4_gemv.h"
#include "ops/linear/x86_fp8_gemv.h"
#include "ops/linear/x86_gemm_amx.h"
#include "ops/linear/x86_gemm_bf16.h"
#include "ops/linear/linear_internal.h"
#include "ops/simd/prefetch.h"
#include "ops/formats/quant.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear/linear_fast.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "ops/linear/linear_fast-inl.h"
#include "ops/linear/weight_decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- block-scaled weights (FP8 E4M3 32x32 scales, FP4 E2M1 1x32 scales) -------------------------

template <bool kFp4>
HWY_INLINE const uint8_t* FastBlockBytes(const uint8_t* wdata, size_t k, size_t n, size_t kb) {
  return kFp4 ? wdata + n * (k / 2) + kb * 16 : wdata + n * k + kb * 32;
}

// The block's scale with the decoder's power-of-two unscale folded in (a product of powers of two:
// exact for every scale a checkpoint can hold, 2^-127..2^127 times 2^-1 or 2^8).
template <bool kFp4>
HWY_INLINE float FastBlockScale(const float* e8m0, const uint8_t* wscales, size_t n, size_t kblocks, size_t kb) {
  if constexpr (kFp4) {
    return e8m0[wscales[n * kblocks + kb]] * 0.5f;
  } else {
    return e8m0[wscales[(n / 32) * kblocks + kb]] * 256.0f;
  }
}

// A block decoder for the GEMV: DecodeBlock, except FP8 on AVX2 (8-lane vectors), where 16 codes
// are widened and masked at once in a 256-bit vector and converted as two halves (the half-float
// trick of DecodeE4m3Over256: same values, fewer instructions). AVX-512 already decodes 16 per vector.
template <bool kFp4>
HWY_INLINE void GemvDecodeBlock(const uint8_t* src, VW* wv) {
#if HWY_TARGET == HWY_AVX2  // 8-lane VW: four vectors per block
  if constexpr (!kFp4) {
    const hn::Full128<int8_t> d8;
    const hn::Full256<int16_t> d16;
    const hn::Full256<hwy::float16_t> dh;
    const hn::Full128<hwy::float16_t> dh128;
    const hn::Full256<float> df;
    const auto mask = hn::Set(d16, static_cast<int16_t>(0xBF80));
    for (size_t g = 0; g < 2; ++g) {
      const auto code = hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const int8_t*>(src) + 16 * g));
      const auto halves = hn::BitCast(dh, hn::And(hn::ShiftLeft<7>(code), mask));
      wv[2 * g] = hn::PromoteTo(df, hn::LowerHalf(dh128, halves));
      wv[2 * g + 1] = hn::PromoteTo(df, hn::UpperHalf(dh128, halves));
    }
    return;
  }
#endif
  DecodeBlock<kFp4>(src, wv);
}

// R activation rows (dequantised, [R, k] with stride k) against weight rows [n_begin, n_end).
template <bool kFp4, size_t R>
HWY_NOINLINE void FastGemvTile(const float* act, const uint8_t* wdata, const uint8_t* wscales, size_t n_total,
                               size_t k, float* y, size_t n_begin, size_t n_end) {
  const DW df;
  const size_t lanes = hn::Lanes(df);
  const size_t nv = 32 / lanes;
  const size_t kblocks = k / 32;
  const float* e8m0 = e8m0_table();
  VW wv[kMaxVecPerBlock];
  for (size_t n = n_begin; n < n_end; ++n) {
    VW acc0[R], acc1[R];  // even and odd blocks: two independent accumulation chains
    for (size_t r = 0; r < R; ++r) acc0[r] = acc1[r] = hn::Zero(df);
    for (size_t kb = 0; kb < kblocks; ++kb) {
      const uint8_t* block = FastBlockBytes<kFp4>(wdata, k, n, kb);
      if (kb % (kFp4 ? 4 : 2) == 0) PrefetchLine(block);  // 16- or 32-byte blocks
      GemvDecodeBlock<kFp4>(block, wv);
      const VW sw = hn::Set(df, FastBlockScale<kFp4>(e8m0, wscales, n, kblocks, kb));
      for (size_t r = 0; r < R; ++r) {
        const float* ab = act + r * k + kb * 32;
        VW t = hn::Mul(hn::LoadU(df, ab), wv[0]);
        for (size_t g = 1; g < nv; ++g) t = hn::MulAdd(hn::LoadU(df, ab + g * lanes), wv[g], t);
        if (kb & 1) {
          acc1[r] = hn::MulAdd(t, sw, acc1[r]);
        } else {
          acc0[r] = hn::MulAdd(t, sw, acc0[r]);
        }
      }
    }
    for (size_t r = 0; r < R; ++r) {
      y[r * n_total + n] = round_bf16(hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0[r], acc1[r]))));
    }
  }
}

// The FP8 GEMV. An FP8 weight scale covers 32 rows x 32 columns, so within one 32-row group every
// row sees the same scale per column block: the activations are multiplied by it once per group
// (exact: powers of two) into a per-thread buffer, and each weight row is then a plain dot product of
// decoded codes with that buffer, C independent fp32 chains per activation row.
// The FP8 block decode of the GEMV. On AVX2 the 32 codes are interleaved under zero bytes (code << 8
// per int16, in-lane: one instruction per 16 instead of a lane-crossing widen), shifted back
// arithmetically and masked into the f16 bits of value · 2^-8 (exact, subnormals included), then
// converted; the four vectors come out holding elements 0-7, 16-23, 8-15, 24-31, which
// kFp8GemvOffset gives the activations. Elsewhere: GemvDecodeBlock, in order.
#if HWY_TARGET == HWY_AVX2
constexpr size_t kFp8GemvOffset[kMaxVecPerBlock] = {0, 16, 8, 24};
HWY_INLINE void Fp8GemvDecode(const uint8_t* src, VW* wv) {
  const hn::Full256<int8_t> d8;
  const hn::Full256<int16_t> d16;
  const hn::Full256<hwy::float16_t> dh;
  const hn::Full128<hwy::float16_t> dh128;
  const hn::Full256<float> df;
  const auto codes = hn::LoadU(d8, reinterpret_cast<const int8_t*>(src));
  const auto mask = hn::Set(d16, static_cast<int16_t>(0xBF80));
  const auto lo = hn::BitCast(d16, hn::InterleaveLower(d8, hn::Zero(d8), codes));  // 0-7 | 16-23
  const auto hi = hn::BitCast(d16, hn::InterleaveUpper(d8, hn::Zero(d8), codes));  // 8-15 | 24-31
  const auto hlo = hn::BitCast(dh, hn::And(hn::ShiftRight<1>(lo), mask));
  const auto hhi = hn::BitCast(dh, hn::And(hn::ShiftRight<1>(hi), mask));
  wv[0] = hn::PromoteTo(df, hn::LowerHalf(dh128, hlo));
  wv[1] = hn::PromoteTo(df, hn::UpperHalf(dh128, hlo));
  wv[2] = hn::PromoteTo(df, hn::LowerHalf(dh128, hhi));
  wv[3] = hn::PromoteTo(df, hn::UpperHalf(dh128, hhi));
}
#else
constexpr size_t kFp8GemvOffset[kMaxVecPerBlock] = {};  // unused: natural order
HWY_INLINE void Fp8GemvDecode(const uint8_t* src, VW* wv) { GemvDecodeBlock<false>(src, wv); }
#endif

template <size_t R>
HWY_NOINLINE void Fp8GemvTile(const float* act, const uint8_t* wdata, const uint8_t* wscales, size_t n_total,
                              size_t k, float* y, size_t n_begin, size_t n_end) {
  const DW df;
  const size_t lanes = hn::Lanes(df);
  const size_t nv = 32 / lanes;
  constexpr size_t C = R == 1 ? 4 : 2;  // accumulation chains per row (FMA latency x throughput)
  const size_t kblocks = k / 32;
  const float* e8m0 = e8m0_table();
  thread_local std::vector<float> prescaled;  // [R, k]; grows to the largest shape, then reused
  if (prescaled.size() < R * k) prescaled.resize(R * k);
  float* pa = prescaled.data();
  VW wv[kMaxVecPerBlock];
  size_t group = SIZE_MAX;
  for (size_t n = n_begin; n < n_end; ++n) {
    if (n / 32 != group) {
      group = n / 32;
      for (size_t kb = 0; kb < kblocks; ++kb) {
        const VW sw = hn::Set(df, FastBlockScale<false>(e8m0, wscales, n, kblocks, kb));
        for (size_t r = 0; r < R; ++r)
          for (size_t g = 0; g < nv; ++g) {
            const size_t i = kb * 32 + g * lanes;
            hn::StoreU(hn::Mul(hn::LoadU(df, act + r * k + i), sw), df, pa + r * k + i);
          }
      }
    }
    VW acc[R][C];
    for (size_t r = 0; r < R; ++r)
      for (size_t c = 0; c < C; ++c) acc[r][c] = hn::Zero(df);
    for (size_t kb = 0; kb < kblocks; ++kb) {
      const uint8_t* codes = FastBlockBytes<false>(wdata, k, n, kb);
      if (kb % 2 == 0) PrefetchLine(codes);  // 32-byte blocks
      Fp8GemvDecode(codes, wv);
      for (size_t r = 0; r < R; ++r) {
        const float* ab = pa + r * k + kb * 32;
        for (size_t g = 0; g < nv; ++g) {
          const size_t offset = HWY_TARGET == HWY_AVX2 ? kFp8GemvOffset[g] : g * lanes;
          acc[r][g % C] = hn::MulAdd(hn::LoadU(df, ab + offset), wv[g], acc[r][g % C]);
        }
      }
    }
    for (size_t r = 0; r < R; ++r) {
      for (size_t c = 1; c < C; ++c) acc[r][0] = hn::Add(acc[r][0], acc[r][c]);
      y[r * n_total + n] = round_bf16(hn::GetLane(hn::SumOfLanes(df, acc[r][0])));
    }
  }
}

#if HWY_TARGET <= HWY_AVX2
// The FP4 GEMV on integers (AVX2 and better): the 32 E2M1 codes of a block become 2·value as int8
// (one byte shuffle per 16), widen to int16 and meet the activation plane (Fp4GemvPlanes in linear.h)
// in pairwise multiply-adds (vpmaddwd). Every product (|2·w| <= 12, |p| < 2^15) and every lane's
// 4-product sum is an exact integer below 2^24, so the per-lane block partials convert to fp32
// exactly; they are then scaled by the weight scale times the block's factor (powers of two) and
// accumulated in fp32 like the float kernel. The few residual blocks are added after the row's main
// pass, in the same way.
struct Fp4IntDecoder {
  hn::Vec<hn::Full256<int8_t>> table;
  hn::Vec<hn::Full256<uint8_t>> low_nibble;
  Fp4IntDecoder()
      : table(hn::LoadDup128(hn::Full256<int8_t>(), kE2m1Twice)), low_nibble(hn::Set(hn::Full256<uint8_t>(), 0x0F)) {}
  // A 16-byte block as int16 256·(2·E2M1): the bytes are broadcast to both 128-bit lanes, the low
  // lane keeps the low nibbles (even elements) and the high lane the high ones (odd elements), one
  // byte shuffle decodes all 32, and interleaving under zero bytes widens in-lane (no lane-crossing
  // widen): `lo` holds even 0-7 | odd 0-7, `hi` even 8-15 | odd 8-15 (the plane order of linear.h).
  HWY_INLINE void Decode(const uint8_t* block, hn::Vec<hn::Full256<int16_t>>* lo,
                         hn::Vec<hn::Full256<int16_t>>* hi) const {
    const hn::Full256<uint8_t> d8;
    const hn::Full256<int8_t> di8;
    const hn::Full256<uint16_t> du16;
    const hn::Full256<int16_t> d16;
    const auto packed = hn::LoadDup128(d8, block);
    const auto shifted = hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(du16, packed)));
    const auto nibbles = hn::And(hn::ConcatUpperLower(d8, shifted, packed), low_nibble);
    const auto twice = hn::TableLookupBytes(table, hn::BitCast(di8, nibbles));
    *lo = hn::BitCast(d16, hn::InterleaveLower(di8, hn::Zero(di8), twice));
    *hi = hn::BitCast(d16, hn::InterleaveUpper(di8, hn::Zero(di8), twice));
  }
};

// Σ over the block of 256·2·w · p, as 8 int32 lanes converted to fp32. Each lane sums 4 products
// 256·(2·w)·p with |2·w| <= 12 and |p| < 2^15: a multiple of 256 below 2^29, so at most 21
// significant bits and exact in fp32.
HWY_INLINE hn::Vec<hn::Full256<float>> Fp4IntBlockPartial(hn::Vec<hn::Full256<int16_t>> lo,
                                                          hn::Vec<hn::Full256<int16_t>> hi, const int16_t* p) {
  const hn::Full256<int16_t> d16;
  const hn::Full256<int32_t> d32;
  const hn::Full256<float> df;
  auto unused = hn::Zero(d32);
  auto sum = hn::ReorderWidenMulAccumulate(d32, lo, hn::LoadU(d16, p), hn::Zero(d32), unused);
  sum = hn::ReorderWidenMulAccumulate(d32, hi, hn::LoadU(d16, p + 16), sum, unused);
  return hn::ConvertTo(df, sum);
}

template <size_t R>
HWY_NOINLINE void Fp4GemvIntTile(const Fp4GemvPlanes& planes, const float* ascales, const uint8_t* wdata,
                                 const uint8_t* wscales, size_t n_total, size_t k, float* y, size_t n_begin,
                                 size_t n_end) {
  const hn::Full256<int16_t> d16;
  const hn::Full256<uint32_t> du32;
  const hn::Full256<float> df;
  const size_t kblocks = k / 32;
  const float* e8m0 = e8m0_table();
  const Fp4IntDecoder decoder;
  hn::Indices256<float> lane[8];  // broadcast of lane j
  for (int32_t j = 0; j < 8; ++j) {
    HWY_ALIGN const int32_t idx[8] = {j, j, j, j, j, j, j, j};
    lane[j] = hn::SetTableIndices(df, idx);
  }
  for (size_t n = n_begin; n < n_end; ++n) {
    const uint8_t* wrow = wdata + n * (k / 2);
    const uint8_t* srow = wscales + n * kblocks;
    hn::Vec<decltype(df)> acc[2][R];  // even and odd blocks: two accumulation chains
    for (size_t r = 0; r < R; ++r) acc[0][r] = acc[1][r] = hn::Zero(df);
    // One block; scale(r) gives the block's weight scale times row r's factor, broadcast.
    const auto block = [&](size_t kb, hn::Vec<decltype(df)>* acc_row, const auto& scale) HWY_ATTR {
      hn::Vec<decltype(d16)> even, odd;
      decoder.Decode(wrow + kb * 16, &even, &odd);
      for (size_t r = 0; r < R; ++r) {
        const auto part = Fp4IntBlockPartial(even, odd, planes.plane + (r * kblocks + kb) * 32);
        acc_row[r] = hn::MulAdd(part, scale(r), acc_row[r]);
      }
    };
    const auto scalar_block = [&](size_t kb, hn::Vec<decltype(df)>* acc_row) HWY_ATTR {
      const float sw = e8m0[srow[kb]];
      block(kb, acc_row, [&](size_t r) HWY_ATTR { return hn::Set(df, sw * planes.factor[r * kblocks + kb]); });
    };
    size_t kb = 0;
    // Groups of 8 blocks: the 8 weight scales become floats at once (E8M0 e is the float with
    // exponent field e, for 1 <= e <= 254), are multiplied by the rows' factors (an exact product of
    // powers of two) and broadcast per block by a lane permute instead of 8 scalar lookups.
    for (; kb + 8 <= kblocks; kb += 8) {
      PrefetchLine(wrow + kb * 16);  // 8 blocks: 128 bytes
      PrefetchLine(wrow + kb * 16 + 64);
      const auto e = hn::PromoteTo(du32, hn::LoadU(hn::Full64<uint8_t>(), srow + kb));
      if (!hn::AllFalse(du32, hn::Or(hn::Eq(e, hn::Zero(du32)), hn::Eq(e, hn::Set(du32, 255u))))) {
        for (size_t j = 0; j < 8; ++j) scalar_block(kb + j, acc[j & 1]);
        continue;
      }
      const auto sw = hn::BitCast(df, hn::ShiftLeft<23>(e));
      hn::Vec<decltype(df)> scales[R];
      for (size_t r = 0; r < R; ++r) scales[r] = hn::Mul(sw, hn::LoadU(df, planes.factor + r * kblocks + kb));
      for (size_t j = 0; j < 8; ++j) {
        block(kb + j, acc[j & 1], [&](size_t r) HWY_ATTR { return hn::TableLookupLanes(scales[r], lane[j]); });
      }
    }
    for (; kb < kblocks; ++kb) scalar_block(kb, acc[kb & 1]);
    for (size_t r = 0; r < R; ++r) {
      for (uint32_t i = 0; i < planes.residual_count[r]; ++i) {
        const size_t rb = planes.residual_block[r * kblocks + i];
        hn::Vec<decltype(d16)> even, odd;
        decoder.Decode(wrow + rb * 16, &even, &odd);
        const auto part = Fp4IntBlockPartial(even, odd, planes.residual_plane + (r * kblocks + i) * 32);
        const float f = e8m0[srow[rb]] * ascales[r * kblocks + rb] * 0x1p-18f;
        acc[1][r] = hn::MulAdd(part, hn::Set(df, f), acc[1][r]);
      }
      y[r * n_total + n] = round_bf16(hn::GetLane(hn::SumOfLanes(df, hn::Add(acc[0][r], acc[1][r]))));
    }
  }
}
#endif

// ---- activation quantisation --------------------------------------------------------------------

// One act_quant block of 32 with its scale s: values[j] = e4m3(x[j] / s) · s, and when `ints` is set,
// ints[j] = e4m3(x[j] / s) · 2^9 (an exact integer). The E4M3 rounding is done on the f32 bits: a
// normal (|v| >= 2^-6) keeps 3 mantissa bits, rounded to nearest even by adding 0x7FFFF plus the
// kept lowest bit and clearing the 20 dropped ones; a subnormal is a multiple of 2^-9, rounded by
// adding and subtracting 2^14 (whose f32 ulp is 2^-9). Both equal f32_to_e4m3 (tested for every
// f32 below 448 in magnitude); a block with a NaN, an infinity or a value at 448 takes the scalar
// conversion instead.
// fp8_block_scale of one block of 32 with the max |x| taken in vectors (a max is exact, so the scale
// is the scalar one's bits); a block holding a NaN takes the scalar path, which propagates it.
HWY_NOINLINE float FastActBlockScale(const float* x) {
  const hn::CappedTag<float, kFp8ActBlock> df;
  const size_t lanes = hn::Lanes(df);
  auto amax = hn::Zero(df);
  bool nan = false;
  for (size_t j = 0; j < kFp8ActBlock; j += lanes) {
    const auto v = hn::LoadU(df, x + j);
    nan |= !hn::AllFalse(df, hn::IsNaN(v));
    amax = hn::Max(amax, hn::Abs(v));
  }
  if (nan) return fp8_block_scale(x);
  return fp8_block_scale_of_amax(hn::GetLane(hn::MaxOfLanes(df, amax)));
}

HWY_NOINLINE void FastQuantBlock(const float* x, float s, float* values, int32_t* ints) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const size_t lanes = hn::Lanes(df);
  const auto vs = hn::Set(df, s);
  // x / s as x · (1 / s): for a normal power of two s the reciprocal is exact (for s = 2^127 the
  // subnormal 2^-127), and both forms round the same exact quotient once, so they agree bit for bit;
  // a multiply costs a fraction of a divide. Any other scale (subnormal, NaN) divides.
  uint32_t s_bits;
  std::memcpy(&s_bits, &s, sizeof(s_bits));
  const bool pow2 = (s_bits & 0x7FFFFFu) == 0 && ((s_bits >> 23) & 0xFFu) != 0 && ((s_bits >> 23) & 0xFFu) != 0xFFu;
  const auto inv = hn::Set(df, 1.0f / s);
  const auto scaled = [&](size_t j) { return pow2 ? hn::Mul(hn::LoadU(df, x + j), inv) : hn::Div(hn::LoadU(df, x + j), vs); };
  bool special = !(s == s);  // NaN scale: the block holds a NaN
  for (size_t j = 0; j < kFp8ActBlock && !special; j += lanes) {
    const auto a = hn::Abs(scaled(j));
    special = !hn::AllTrue(df, hn::Lt(a, hn::Set(df, kE4M3Max)));  // false for NaN too
  }
  if (special) {
    const float* table = e4m3_table();
    for (size_t j = 0; j < kFp8ActBlock; ++j) {
      const float q = table[f32_to_e4m3(x[j] / s)];
      values[j] = q * s;
      if (ints != nullptr) ints[j] = static_cast<int32_t>(q * 512.0f);
    }
    return;
  }
  const auto sign_bit = hn::Set(di, static_cast<int32_t>(0x80000000u));
  for (size_t j = 0; j < kFp8ActBlock; j += lanes) {
    const auto v = scaled(j);  // exact for a power-of-two s (barring underflow, rounded as the divide)
    const auto bits = hn::BitCast(di, v);
    const auto sign = hn::And(bits, sign_bit);
    const auto mag = hn::AndNot(sign_bit, bits);
    const auto kept_lsb = hn::And(hn::ShiftRight<20>(mag), hn::Set(di, 1));
    const auto normal = hn::And(hn::Add(mag, hn::Add(hn::Set(di, 0x7FFFF), kept_lsb)),
                                hn::Set(di, static_cast<int32_t>(0xFFF00000u)));
    const auto a = hn::BitCast(df, mag);
    const auto magic = hn::Set(df, 0x1p14f);
    const auto subnormal = hn::Sub(hn::Add(a, magic), magic);
    const auto rounded = hn::IfThenElse(hn::Lt(a, hn::Set(df, 0x1p-6f)), subnormal, hn::BitCast(df, normal));
    const auto q = hn::BitCast(df, hn::Or(hn::BitCast(di, rounded), sign));
    hn::StoreU(hn::Mul(q, vs), df, values + j);
    if (ints != nullptr) hn::StoreU(hn::ConvertTo(di, hn::Mul(q, hn::Set(df, 512.0f))), di, ints + j);
  }
}

// ---- the block-scaled GEMV / GEMM (the panels: PanelGemm, linear_fast-inl.h) --------------------

// The bytes a panel's rows hold for the next K step, into L2 while this step's tiles run (PanelGemm
// visits a column group's panels K step by K step): a panel reads a few lines from each of 16 rows, a
// pattern the hardware prefetcher does not follow, and these loads were most of the panels' decoding
// time. `rows` rows of `bytes` bytes from `first`, `stride` apart; addresses formed as integers, as
// in ops/simd/prefetch.h.
HWY_INLINE void PrefetchPanelRows(const uint8_t* first, size_t rows, size_t stride, size_t bytes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(first);
  for (size_t r = 0; r < rows; ++r)
    for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(reinterpret_cast<const void*>(at + r * stride + b), 0, 2);
}

template <bool kFp4>
void FastBlockGemm(const ActivationLayout& a, const uint8_t* wdata, const uint8_t* wscales, size_t n_total, size_t k,
                   float* y, size_t n_begin, size_t n_end) {
#if HWY_TARGET <= HWY_AVX2
  if (kFp4 && a.m < fast::kFastGemmMinRows && a.fp4_planes.bf16_plane != nullptr) {
    // Laid out for the AVX512-BF16 form (ops/linear/x86_fp4_gemv.h): only on CPUs that have it.
    const size_t words = x86::fp4_bf16_plane_words(k);
    for (size_t m0 = 0; m0 < a.m; m0 += kGemvRows)
      x86::fp4_gemv_bf16(a.fp4_planes.bf16_plane + m0 * words, std::min(kGemvRows, a.m - m0), wdata, wscales, n_total,
                         k, y + m0 * n_total, n_begin, n_end);
    return;
  }
  if (kFp4 && a.m < fast::kFastGemmMinRows && a.fp4_planes.vnni_plane != nullptr) {
    // Planes packed for the AVX512-VNNI kernel (ops/linear/x86_fp4_gemv.h): only on CPUs that have it.
    const size_t kblocks = k / 32;
    const size_t padded = x86::fp4_vnni_padded_blocks(kblocks);
    for (size_t m0 = 0; m0 < a.m; m0 += kGemvRows) {
      const Fp4GemvPlanes& all = a.fp4_planes;
      Fp4GemvPlanes planes = all;
      planes.factor += m0 * kblocks;
      planes.residual_count += m0;
      planes.residual_block += m0 * kblocks;
      planes.residual_plane += m0 * kblocks * 32;
      planes.vnni_plane += m0 * padded * 64;
      planes.vnni_correction += m0 * padded;
      x86::fp4_gemv_vnni(planes, std::min(kGemvRows, a.m - m0), a.scales + m0 * kblocks, wdata, wscales, n_total, k,
                         y + m0 * n_total, n_begin, n_end);
    }
    return;
  }
#endif
#if HWY_TARGET <= HWY_AVX2
  if (kFp4 && a.m < fast::kFastGemmMinRows && a.fp4_planes.plane != nullptr) {
    const size_t kblocks = k / 32;
    for (size_t m0 = 0; m0 < a.m; m0 += kGemvRows) {
      const size_t rows = std::min(kGemvRows, a.m - m0);
      const float* ascales = a.scales + m0 * kblocks;
      const Fp4GemvPlanes& all = a.fp4_planes;
      const Fp4GemvPlanes planes{all.plane + m0 * kblocks * 32, all.factor + m0 * kblocks, all.residual_count + m0,
                                 all.residual_block + m0 * kblocks, all.residual_plane + m0 * kblocks * 32};
      float* ym = y + m0 * n_total;
      switch (rows) {
        case 4: Fp4GemvIntTile<4>(planes, ascales, wdata, wscales, n_total, k, ym, n_begin, n_end); break;
        case 3: Fp4GemvIntTile<3>(planes, ascales, wdata, wscales, n_total, k, ym, n_begin, n_end); break;
        case 2: Fp4GemvIntTile<2>(planes, ascales, wdata, wscales, n_total, k, ym, n_begin, n_end); break;
        default: Fp4GemvIntTile<1>(planes, ascales, wdata, wscales, n_total, k, ym, n_begin, n_end); break;
      }
    }
    return;
  }
#endif
  if (!kFp4 && a.m < fast::kFastGemmMinRows) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    // AVX512-VBMI + BF16 CPUs: the byte-table decode and bf16 dot products (x86_fp8_gemv.h); a group it
    // declines takes the kernel below.
    if (x86::fp8_gemv_bf16_usable()) {
      for (size_t m0 = 0; m0 < a.m; m0 += kGemvRows) {
        const size_t rows = std::min(kGemvRows, a.m - m0);
        const float* am = a.values + m0 * k;
        float* ym = y + m0 * n_total;
        for (size_t n = n_begin; n < n_end;) {
          n = x86::fp8_gemv_bf16(am, rows, wdata, wscales, n_total, k, ym, n, n_end);
          if (n == n_end) break;
          const size_t group_end = std::min(n_end, (n / 32 + 1) * 32);
          switch (rows) {
            case 4: Fp8GemvTile<4>(am, wdata, wscales, n_total, k, ym, n, group_end); break;
            case 3: Fp8GemvTile<3>(am, wdata, wscales, n_total, k, ym, n, group_end); break;
            case 2: Fp8GemvTile<2>(am, wdata, wscales, n_total, k, ym, n, group_end); break;
            default: Fp8GemvTile<1>(am, wdata, wscales, n_total, k, ym, n, group_end); break;
          }
          n = group_end;
        }
      }
      return;
    }
#endif
    size_t m0 = 0;
    for (; m0 + kGemvRows <= a.m; m0 += kGemvRows)
      Fp8GemvTile<kGemvRows>(a.values + m0 * k, wdata, wscales, n_total, k, y + m0 * n_total, n_begin, n_end);
    float* ym = y + m0 * n_total;
    const float* am = a.values + m0 * k;
    switch (a.m - m0) {
      case 3: Fp8GemvTile<3>(am, wdata, wscales, n_total, k, ym, n_begin, n_end); break;
      case 2: Fp8GemvTile<2>(am, wdata, wscales, n_total, k, ym, n_begin, n_end); break;
      case 1: Fp8GemvTile<1>(am, wdata, wscales, n_total, k, ym, n_begin, n_end); break;
      default: break;
    }
    return;
  }
  if (a.m < fast::kFastGemmMinRows) {
    size_t m0 = 0;
    for (; m0 + kGemvRows <= a.m; m0 += kGemvRows)
      FastGemvTile<kFp4, kGemvRows>(a.values + m0 * k, wdata, wscales, n_total, k, y + m0 * n_total, n_begin, n_end);
    float* ym = y + m0 * n_total;
    const float* am = a.values + m0 * k;
    switch (a.m - m0) {
      case 3: FastGemvTile<kFp4, 3>(am, wdata, wscales, n_total, k, ym, n_begin, n_end); break;
      case 2: FastGemvTile<kFp4, 2>(am, wdata, wscales, n_total, k, ym, n_begin, n_end); break;
      case 1: FastGemvTile<kFp4, 1>(am, wdata, wscales, n_total, k, ym, n_begin, n_end); break;
      default: break;
    }
    return;
  }
  const DW df;
  const size_t lanes = hn::Lanes(df);
  const size_t kblocks = k / 32;
  const float* e8m0 = e8m0_table();
  const auto decode_row = [&](size_t n, size_t k0, size_t kc, float* dst) {
    VW wv[kMaxVecPerBlock];
    for (size_t kb = k0 / 32; kb < (k0 + kc) / 32; ++kb) {
      DecodeBlock<kFp4>(FastBlockBytes<kFp4>(wdata, k, n, kb), wv);
      const VW sw = hn::Set(df, FastBlockScale<kFp4>(e8m0, wscales, n, kblocks, kb));
      for (size_t g = 0; g < 32 / lanes; ++g) hn::StoreU(hn::Mul(wv[g], sw), df, dst + kb * 32 - k0 + g * lanes);
    }
  };
  if constexpr (kFp4) {
    // FP4 panels go straight from the packed bytes to bf16 pairs (a byte is one pair).
    const auto decode_panel = [&](size_t n0, size_t nr, size_t k0, size_t kc, uint32_t* panel, int* lo, int* hi) {
      if (k0 + kc < k)
        PrefetchPanelRows(wdata + n0 * (k / 2) + (k0 + kc) / 2, nr, k / 2, std::min(kPanelK, k - k0 - kc) / 2);
      return x86::fp4_panel_bf16_pairs(wdata + n0 * (k / 2) + k0 / 2, k / 2, wscales + n0 * kblocks + k0 / 32, kblocks,
                                       nr, kc / 32, panel, lo, hi);
    };
    const auto panel_gemm = [&](size_t begin, size_t end) {
      PanelGemm(a.values, a.m, k, n_total, y, begin, end, decode_row, [](float v) { return round_bf16(v); },
                a.bf16_pairs, a.bf16_exp_lo, a.bf16_exp_hi, decode_panel);
    };
    if (a.amx_pairs == nullptr || !x86::gemm_amx_usable()) return panel_gemm(n_begin, n_end);
    // Few rows on AMX: 16 weight rows at a time as the left-hand tiles; rows it declines take the
    // panels (which load and release the tile configuration themselves).
    std::optional<x86::AmxTiles> tiles;
    for (size_t n0 = n_begin; n0 < n_end; n0 += kPanelCols) {
      const size_t nr = std::min(kPanelCols, n_end - n0);
      if (!tiles) tiles.emplace();
      if (x86::fp4_rows_amx(a.amx_pairs, a.m, a.bf16_exp_lo, a.bf16_exp_hi, wdata, wscales, k, n0, nr, y, n_total))
        continue;
      tiles.reset();
      panel_gemm(n0, n0 + nr);
    }
  } else {
    // FP8 panels likewise, where the 16 rows share one 32-row scale group (always, for callers that
    // split rows in multiples of 16).
    const auto decode_panel = [&](size_t n0, size_t nr, size_t k0, size_t kc, uint32_t* panel, int* lo, int* hi) {
      if (k0 + kc < k) PrefetchPanelRows(wdata + n0 * k + k0 + kc, nr, k, std::min(kPanelK, k - k0 - kc));
      if (n0 % 32 + nr > 32) return false;
      return x86::fp8_panel_bf16_pairs(wdata + n0 * k + k0, k, wscales + (n0 / 32) * kblocks + k0 / 32, nr, kc / 32,
                                       panel, lo, hi);
    };
    PanelGemm(a.values, a.m, k, n_total, y, n_begin, n_end, decode_row, [](float v) { return round_bf16(v); },
              a.bf16_pairs, a.bf16_exp_lo, a.bf16_exp_hi, decode_panel);
  }
}

void FastGemmFp8(const ActivationLayout& a, const Fp8Weight& w, float* y, size_t n_begin, size_t n_end) {
  FastBlockGemm<false>(a, w.codes, w.scales, w.n, w.k, y, n_begin, n_end);
}
void FastGemmFp4(const ActivationLayout& a, const Fp4Weight& w, float* y, size_t n_begin, size_t n_end) {
  FastBlockGemm<true>(a, w.packed, w.scales, w.n, w.k, y, n_begin, n_end);
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {

HWY_EXPORT(FastQuantBlock);
HWY_EXPORT(FastActBlockScale);
HWY_EXPORT(FastGemmFp8);
HWY_EXPORT(FastGemmFp4);
HWY_EXPORT(ToBf16Pairs);

namespace fast {
// values [m, k] + scales [m, k/32], for GEMM-sized m the bf16 pairs [m, k/2], and for GEMV-sized m
// the FP4 integer planes (Fp4GemvPlanes:
// plane and residual plane int16 [m, k/32, 32] each, factor and residual blocks [m, k/32], counts [m]).
// The byte planes of the AVX512-VNNI FP4 kernel (ops/linear/x86_fp4_gemv.h) take 64 bytes per padded block
// and the corrections 4: 17 floats.
size_t act_scratch_floats(size_t m, size_t k) {
  const size_t kblocks = k / kFp8ActBlock;
  const size_t planes = m * k + 2 * m * kblocks + m + 17 * m * x86::fp4_vnni_padded_blocks(kblocks);
  const size_t amx_pairs = m <= x86::kAmxSmallGemmRows ? (m + 15) / 16 * 16 * k / 2 : 0;
  return m * k + m * kblocks + (m < kFastGemmMinRows ? planes : m * k / 2 + amx_pairs);
}

namespace {
// Fills the Fp4GemvPlanes of m rows (layout in linear.h) while quantising them: values and scales as
// quantize_activations, plus the integer planes.
Fp4GemvPlanes quantize_fp4_planes(const float* x, size_t m, size_t k, float* values, float* scales, float* storage) {
  const size_t kblocks = k / kFp8ActBlock;
  // A block holding a NaN or an infinity has a non-finite scale, and its values cannot be integers:
  // with such a block no planes are built, and the float GEMV reads the values (NaN and all).
  bool finite = true;
  for (size_t b = 0; b < m * kblocks; ++b) {
    scales[b] = HWY_DYNAMIC_DISPATCH(FastActBlockScale)(x + b * kFp8ActBlock);
    finite &= std::isfinite(scales[b]);
  }
  const bool bf16 = x86::fp4_gemv_bf16_usable();
  if (bf16 || !finite) {
    for (size_t b = 0; b < m * kblocks; ++b)
      HWY_DYNAMIC_DISPATCH(FastQuantBlock)(x + b * kFp8ActBlock, scales[b], values + b * kFp8ActBlock, nullptr);
  }
  if (!finite) return {};
  if (bf16) {
    // The bf16 form needs only the values, laid out once; the integer planes below are the fallback
    // for activations it cannot take exactly (nonzero values below 2^-125).
    uint16_t* plane = reinterpret_cast<uint16_t*>(storage);
    const size_t words = x86::fp4_bf16_plane_words(k);
    bool ok = true;
    for (size_t r = 0; r < m && ok; ++r) ok = x86::fp4_bf16_pack_row(values + r * k, k, plane + r * words);
    if (ok) {
      Fp4GemvPlanes planes;
      planes.bf16_plane = plane;
      return planes;
    }
  }
  int16_t* plane = reinterpret_cast<int16_t*>(storage);
  int16_t* residual_plane = plane + m * k;
  float* factor = storage + m * k;
  uint32_t* residual_block = reinterpret_cast<uint32_t*>(factor + m * kblocks);
  uint32_t* residual_count = residual_block + m * kblocks;
  // The AVX512-VNNI kernel's byte planes replace the int16 plane where that kernel runs.
  const bool vnni = x86::fp4_gemv_vnni_usable();
  const size_t padded = x86::fp4_vnni_padded_blocks(kblocks);
  int8_t* vnni_plane = reinterpret_cast<int8_t*>(residual_count + m);
  int32_t* vnni_correction = reinterpret_cast<int32_t*>(vnni_plane + m * padded * 64);
  if (vnni) {
    std::memset(vnni_plane, 0, m * padded * 64);  // the padding blocks count zero
    std::memset(vnni_correction, 0, m * padded * sizeof(int32_t));
  }
  for (size_t r = 0; r < m; ++r) {
    uint32_t count = 0;
    for (size_t kb = 0; kb < kblocks; ++kb) {
      const size_t b = r * kblocks + kb;
      int32_t v[kFp8ActBlock];  // q · 2^9, exact integers
      HWY_DYNAMIC_DISPATCH(FastQuantBlock)(x + b * kFp8ActBlock, scales[b], values + b * kFp8ActBlock, v);
      int32_t max_abs = 0;
      for (size_t j = 0; j < kFp8ActBlock; ++j) max_abs = std::max(max_abs, std::abs(v[j]));
      int shift = 0;
      while ((max_abs >> shift) > INT16_MAX) ++shift;  // at most 3: |v| <= 448 · 2^9 < 2^18
      const int32_t low_bits = (1 << shift) - 1;
      int32_t residual = 0;
      for (size_t j = 0; j < kFp8ActBlock; ++j) residual |= v[j] & low_bits;
      if (vnni) {
        int32_t p[kFp8ActBlock];
        for (size_t j = 0; j < kFp8ActBlock; ++j) p[j] = v[j] >> shift;  // floor(v / 2^shift)
        x86::fp4_vnni_pack_block(p, kb, vnni_plane + r * padded * 64, vnni_correction + r * padded);
      } else {
        for (size_t j = 0; j < kFp8ActBlock; ++j) plane[b * 32 + fp4_plane_slot(j)] = static_cast<int16_t>(v[j] >> shift);
      }
      factor[b] = std::ldexp(scales[b], shift - 18);
      if (residual != 0) {
        int16_t* rp = residual_plane + (r * kblocks + count) * 32;
        for (size_t j = 0; j < kFp8ActBlock; ++j) rp[fp4_plane_slot(j)] = static_cast<int16_t>(v[j] & low_bits);
        residual_block[r * kblocks + count++] = static_cast<uint32_t>(kb);
      }
    }
    residual_count[r] = count;
  }
  if (vnni) return {nullptr, factor, residual_count, residual_block, residual_plane, vnni_plane, vnni_correction};
  return {plane, factor, residual_count, residual_block, residual_plane};
}
}  // namespace

namespace {
// fp4_planes: also fill the FP4 GEMV's integer planes (rows < kFastGemmMinRows). The FP8 linears skip
// them: they are scalar work on the calling thread, and an FP8 GEMV never reads them.
PreparedActivations quantize(const float* x, size_t m, size_t k, std::span<float> scratch, bool fp4_planes) {
  CEDAR_CHECK(k % kFp8ActBlock == 0, "activation width %zu is not a multiple of 32", k);
  CEDAR_CHECK(scratch.size() >= act_scratch_floats(m, k), "linear scratch too small: %zu < %zu", scratch.size(),
              act_scratch_floats(m, k));
  float* values = scratch.data();          // [m, k]
  float* scales = scratch.data() + m * k;  // [m, k/32]
  ActivationLayout a{values, scales, m, k};
  a.dequantized = true;
  if (fp4_planes && m < kFastGemmMinRows) {
    a.fp4_planes = quantize_fp4_planes(x, m, k, values, scales, scales + m * (k / kFp8ActBlock));
    return ActivationAccess::wrap(a);
  }
  for (size_t b = 0; b < m * k / kFp8ActBlock; ++b) {
    scales[b] = HWY_DYNAMIC_DISPATCH(FastActBlockScale)(x + b * kFp8ActBlock);
    HWY_DYNAMIC_DISPATCH(FastQuantBlock)(x + b * kFp8ActBlock, scales[b], values + b * kFp8ActBlock, nullptr);
  }
  if (m >= kFastGemmMinRows && x86::gemm_bf16_usable()) {
    uint32_t* pairs = reinterpret_cast<uint32_t*>(scales + m * (k / kFp8ActBlock));
    int lo = 255, hi = 0;
    if (HWY_DYNAMIC_DISPATCH(ToBf16Pairs)(values, m * k / 2, pairs, &lo, &hi)) {
      a.bf16_pairs = pairs;
      a.bf16_exp_lo = lo;
      a.bf16_exp_hi = hi;
      // An FP4 GEMM of few rows takes the weights as the left-hand tiles (fp4_rows_amx).
      if (fp4_planes && m <= x86::kAmxSmallGemmRows && x86::gemm_amx_usable()) {
        uint32_t* amx_pairs = pairs + m * k / 2;
        x86::amx_pairs_from_rows(pairs, m, k, amx_pairs);
        a.amx_pairs = amx_pairs;
      }
    }
  }
  return ActivationAccess::wrap(a);
}

}  // namespace

PreparedActivations quantize_activations(const float* x, size_t m, size_t k, std::span<float> scratch) {
  return quantize(x, m, k, scratch, true);
}

void gemm_fp8(const PreparedActivations& act, const Fp8Weight& w, float* y, ThreadPool* pool) {
  const ActivationLayout& a = ActivationAccess::layout(act);
  CEDAR_CHECK(a.dequantized, "fast::gemm_fp8 needs activations from fast::quantize_activations");
  CEDAR_CHECK(a.k == w.k && w.k % 32 == 0, "gemm_fp8: activation k %zu vs weight k %zu (multiple of 32)", a.k,
              w.k);
  for_rows(pool, w.n, [&](size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(FastGemmFp8)(a, w, y, b, e); }, 32);
}

void gemm_fp4(const PreparedActivations& act, const Fp4Weight& w, float* y, ThreadPool* pool) {
  const ActivationLayout& a = ActivationAccess::layout(act);
  CEDAR_CHECK(a.dequantized, "fast::gemm_fp4 needs activations from fast::quantize_activations");
  CEDAR_CHECK(a.k == w.k && w.k % 32 == 0, "gemm_fp4: activation k %zu vs weight k %zu (multiple of 32)", a.k,
              w.k);
  for_rows(pool, w.n, [&](size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(FastGemmFp4)(a, w, y, b, e); });
}

PreparedActivations quantize_activations_fp8(const float* x, size_t m, size_t k, std::span<float> scratch) {
  return quantize(x, m, k, scratch, false);
}

void gemm_fp8_rows(const PreparedActivations& act, const Fp8Weight& w, float* y, size_t n_begin, size_t n_end) {
  const ActivationLayout& a = ActivationAccess::layout(act);
  CEDAR_CHECK(a.dequantized && a.k == w.k && w.k % 32 == 0,
              "fast::gemm_fp8_rows: activations from fast::quantize_activations, k %zu", w.k);
  HWY_DYNAMIC_DISPATCH(FastGemmFp8)(a, w, y, n_begin, n_end);
}

void gemm_fp4_rows(const PreparedActivations& act, const Fp4Weight& w, float* y, size_t n_begin, size_t n_end) {
  const ActivationLayout& a = ActivationAccess::layout(act);
  CEDAR_CHECK(a.dequantized && a.k == w.k, "fast::gemm_fp4_rows: activations from fast::quantize_activations, k %zu",
              w.k);
  HWY_DYNAMIC_DISPATCH(FastGemmFp4)(a, w, y, n_begin, n_end);
}

void linear_fp8(const float* x, size_t m, const Fp8Weight& w, float* y, std::span<float> scratch,
                ThreadPool* pool) {
  fast::gemm_fp8(quantize(x, m, w.k, scratch, false), w, y, pool);
}

void linear_fp4(const float* x, size_t m, const Fp4Weight& w, float* y, std::span<float> scratch,
                ThreadPool* pool) {
  fast::gemm_fp4(fast::quantize_activations(x, m, w.k, scratch), w, y, pool);
}

void linear_fp8_bf16_rows(const PreparedActivations& act, const Fp8Weight& w, float* y, LinearOut out, size_t n_begin,
                          size_t n_end) {
  const ActivationLayout& x = ActivationAccess::layout(act);
  CEDAR_CHECK(w.k % 32 == 0, "linear_fp8_bf16: k %zu is not a multiple of 32", w.k);
  CEDAR_CHECK(x.k == w.k, "linear_fp8_bf16: x has %zu columns, the weight %zu", x.k, w.k);
  // The FP8 GEMMs read `values` as given when dequantized: x itself, unquantised. They round to bf16;
  // an f32 output needs the unrounded sums, which only bf16 output (wo_a) uses here.
  CEDAR_CHECK(out == LinearOut::kBf16, "fast::linear_fp8_bf16 supports bf16 output only");
  ActivationLayout a{x.values, nullptr, x.m, w.k};
  a.dequantized = true;
  a.bf16_pairs = x.bf16_pairs;
  a.bf16_exp_lo = x.bf16_exp_lo;
  a.bf16_exp_hi = x.bf16_exp_hi;
  HWY_DYNAMIC_DISPATCH(FastGemmFp8)(a, w, y, n_begin, n_end);
}

bool pair_unquantized(PreparedActivations* act, uint32_t* pairs) {
  ActivationLayout* a = &ActivationAccess::layout(*act);
  if (a->m < kFastGemmMinRows || a->k % 32 != 0 || !x86::gemm_bf16_usable()) return false;
  int lo = 255, hi = 0;
  if (!HWY_DYNAMIC_DISPATCH(ToBf16Pairs)(a->values, a->m * a->k / 2, pairs, &lo, &hi)) return false;
  a->bf16_pairs = pairs;
  a->bf16_exp_lo = lo;
  a->bf16_exp_hi = hi;
  return true;
}

void linear_fp8_bf16(const float* x, size_t m, const Fp8Weight& w, float* y, LinearOut out, ThreadPool* pool) {
  // x is packed into pairs once, before the threads split the rows (a thread's buffer, grown once).
  PreparedActivations a = PreparedActivations::unquantized(x, m, w.k);
  thread_local std::vector<uint32_t> pairs;
  if (m >= kFastGemmMinRows && w.k % 32 == 0 && x86::gemm_bf16_usable()) {
    if (pairs.size() < m * w.k / 2) pairs.resize(m * w.k / 2);
    pair_unquantized(&a, pairs.data());
  }
  for_rows(pool, w.n, [&](size_t b, size_t e) { fast::linear_fp8_bf16_rows(a, w, y, out, b, e); }, 32);
}

}  // namespace fast
}  // namespace cedar::ops
#endif  // HWY_ONCE
