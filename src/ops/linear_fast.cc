// The fast linear kernels of linear_fast.h: Highway kernels compiled for every enabled target and
// chosen at run time. Two shapes:
//   * GEMV (m < kFastGemmMinRows, decode): each weight block is decoded once into registers and
//     multiplied with up to four activation rows; per-block fp32 partials are scaled by the block's
//     power-of-two scale and accumulated in vector lanes, reduced once per output.
//   * GEMM (prefill): per thread, 16 weight rows x 256 K are decoded (scale applied, exact) into a
//     K-major panel that stays in L1, and a 6-row x 16-column register tile of fp32 accumulators
//     runs over it with one broadcast activation per row and K step (no horizontal reductions).
#include "ops/linear_fast.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/bf16_coded.h"
#include "ops/formats.h"
#include "ops/fp4_gemv_x86.h"
#include "ops/fp8_gemv_x86.h"
#include "ops/gemm_amx_x86.h"
#include "ops/gemm_bf16_x86.h"
#include "ops/linear_internal.h"
#include "ops/prefetch.h"
#include "ops/quant.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear_fast.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "ops/weight_decode-inl.h"

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

constexpr size_t kGemvRows = 4;  // activation rows sharing one decoded weight block
// The GEMVs prefetch their weights ahead of the lines being read (ops/prefetch.h), once per 64-byte
// line. The weights are contiguous across rows, so the addresses run on into the next rows.
HWY_INLINE void PrefetchLine(const void* line) { prefetch_weight_stream(line); }

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

// ---- bf16 pairs for the AVX512-BF16 tile (ops/gemm_bf16_x86.h) ----------------------------------

// Packs pairs of f32 values into u32 lanes of bf16 bits (the first value in the low half) while
// checking that every value is zero or a normal bf16 number (low 16 bits clear, exponent field
// 1..254) and tracking the smallest and largest exponent field of the nonzero values.
template <class DU>
class Bf16PairPacker {
 public:
  using V = hn::Vec<DU>;
  explicit Bf16PairPacker(DU du) : du_(du), bad_(hn::Zero(du)), lo_(hn::Set(du, 255u)), hi_(hn::Zero(du)) {}
  V Pack(V first, V second) {
    Check(first);
    Check(second);
    return hn::Or(hn::ShiftRight<16>(first), hn::AndNot(hn::Set(du_, 0xFFFFu), second));
  }
  // True when every value was representable; then lo / hi take the exponent range (unchanged if all
  // values were zero).
  bool Finish(int* lo, int* hi) const {
    if (!hn::AllTrue(du_, hn::Eq(bad_, hn::Zero(du_)))) return false;
    *lo = std::min(*lo, static_cast<int>(hn::GetLane(hn::MinOfLanes(du_, lo_))));
    *hi = std::max(*hi, static_cast<int>(hn::GetLane(hn::MaxOfLanes(du_, hi_))));
    return true;
  }

 private:
  void Check(V x) {
    const auto mag = hn::And(x, hn::Set(du_, 0x7FFFFFFFu));
    const auto e = hn::ShiftRight<23>(mag);
    const auto nonzero = hn::Ne(mag, hn::Zero(du_));
    const auto special = hn::And(nonzero, hn::Or(hn::Eq(e, hn::Zero(du_)), hn::Eq(e, hn::Set(du_, 255u))));
    bad_ = hn::Or(bad_, hn::Or(hn::And(x, hn::Set(du_, 0xFFFFu)), hn::IfThenElseZero(special, hn::Set(du_, 1u))));
    lo_ = hn::Min(lo_, hn::IfThenElse(nonzero, e, hn::Set(du_, 255u)));
    hi_ = hn::Max(hi_, hn::IfThenElseZero(nonzero, e));
  }
  DU du_;
  V bad_, lo_, hi_;
};

// pairs[i] = (v[2i], v[2i + 1]) for i < n_pairs (a multiple of 16): activations, and decoded weight rows.
HWY_NOINLINE bool ToBf16Pairs(const float* v, size_t n_pairs, uint32_t* pairs, int* lo, int* hi) {
  const hn::CappedTag<uint32_t, 16> du;
  const uint32_t* bits = reinterpret_cast<const uint32_t*>(v);
  Bf16PairPacker<decltype(du)> packer(du);
  for (size_t i = 0; i < n_pairs; i += hn::Lanes(du)) {
    hn::Vec<decltype(du)> even, odd;
    hn::LoadInterleaved2(du, bits + 2 * i, even, odd);
    hn::StoreU(packer.Pack(even, odd), du, pairs + i);
  }
  return packer.Finish(lo, hi);
}

// ---- the tiled GEMM over decoded panels ----------------------------------------------------------

constexpr size_t kPanelCols = 16;  // weight rows per panel
constexpr size_t kPanelK = 256;    // K per panel (a multiple of 32)
constexpr size_t kTileRows = 6;    // activation rows per register tile
using DP = hn::CappedTag<float, kPanelCols>;
constexpr size_t kPanelVecs = kPanelCols / hn::MaxLanes(DP());

// acc[MR, 16] (+)= act[MR, kc] (row stride lda) x panel[kc, 16]; `first` starts from zero.
template <size_t MR>
HWY_INLINE void PanelTile(const float* HWY_RESTRICT act, size_t lda, const float* HWY_RESTRICT panel, size_t kc,
                          float* HWY_RESTRICT acc_out, bool first) {
  const DP d;
  const size_t L = hn::Lanes(d);
  hn::Vec<DP> acc[MR][kPanelVecs];
  for (size_t r = 0; r < MR; ++r)
    for (size_t v = 0; v < kPanelVecs; ++v)
      acc[r][v] = first ? hn::Zero(d) : hn::Load(d, acc_out + r * kPanelCols + v * L);
  for (size_t kk = 0; kk < kc; ++kk) {
    hn::Vec<DP> w[kPanelVecs];
    for (size_t v = 0; v < kPanelVecs; ++v) w[v] = hn::Load(d, panel + kk * kPanelCols + v * L);
    for (size_t r = 0; r < MR; ++r) {
      const auto a = hn::Set(d, act[r * lda + kk]);
      for (size_t v = 0; v < kPanelVecs; ++v) acc[r][v] = hn::MulAdd(a, w[v], acc[r][v]);
    }
  }
  for (size_t r = 0; r < MR; ++r)
    for (size_t v = 0; v < kPanelVecs; ++v) hn::Store(acc[r][v], d, acc_out + r * kPanelCols + v * L);
}

HWY_INLINE void PanelTileRows(size_t mr, const float* act, size_t lda, const float* panel, size_t kc, float* acc,
                              bool first) {
  switch (mr) {
    case 6: return PanelTile<6>(act, lda, panel, kc, acc, first);
    case 5: return PanelTile<5>(act, lda, panel, kc, acc, first);
    case 4: return PanelTile<4>(act, lda, panel, kc, acc, first);
    case 3: return PanelTile<3>(act, lda, panel, kc, acc, first);
    case 2: return PanelTile<2>(act, lda, panel, kc, acc, first);
    default: return PanelTile<1>(act, lda, panel, kc, acc, first);
  }
}

constexpr size_t kGroupPanels = 4;  // panels sharing each K step in PanelGemm

// One K step [k0, k0 + kc) of the bf16 panels of a column group (n_panels of them, acc[j] [m, 16]
// each) against act_pairs [m, k / 2]: on AMX tiles (16 rows at a time; the rows past the last whole
// tile are copied into `tail_pairs`, 16 x kc / 2, whose other rows are zero, and their sums land in
// acc rows past m, never read), else on the AVX512-BF16 tile.
HWY_INLINE void Bf16PanelTiles(bool amx, size_t m, size_t k, size_t k0, size_t kc, const uint32_t* act_pairs,
                               const uint32_t* const* panels, size_t n_panels, float* const* acc,
                               uint32_t* tail_pairs) {
  const bool first = k0 == 0;
  if (!amx) {
    for (size_t j = 0; j < n_panels; ++j)
      for (size_t m0 = 0; m0 < m; m0 += kTileRows) {
        x86::panel_tile_bf16(std::min(kTileRows, m - m0), act_pairs + (m0 * k + k0) / 2, k / 2, panels[j], kc / 2,
                             acc[j] + m0 * kPanelCols, first);
      }
    return;
  }
  const size_t m16 = m / 16 * 16;
  x86::panel_tiles_amx(m16, act_pairs + k0 / 2, k / 2, panels, n_panels, kc / 2, acc, first);
  if (m16 == m) return;
  std::fill(tail_pairs, tail_pairs + 16 * kc / 2, 0u);
  for (size_t r = m16; r < m; ++r) std::copy_n(act_pairs + (r * k + k0) / 2, kc / 2, tail_pairs + (r - m16) * kc / 2);
  float* tail_acc[kGroupPanels];
  for (size_t j = 0; j < n_panels; ++j) tail_acc[j] = acc[j] + m16 * kPanelCols;
  x86::panel_tiles_amx(16, tail_pairs, kc / 2, panels, n_panels, kc / 2, tail_acc, first);
}

// y[m, n_begin..n_end) = out(act[m, k] · decoded weight rows). decode_row(n, k0, kc, dst) writes the
// exact fp32 values of weight row n, columns [k0, k0 + kc), to dst.
// act_pairs (may be nullptr): the activations as bf16 pairs (Fp8Activations::bf16_pairs, exponent
// fields act_lo..act_hi); a panel whose weights are bf16 values too, with products that can neither
// flush to zero nor overflow, then runs on the AMX tiles (gemm_amx_x86.h) or the AVX512-BF16 tile.
// decode_panel (optional): decode_panel(n0, nr, k0, kc, panel_pairs, &lo, &hi) writes the bf16
// panel of weight rows [n0, n0 + nr), columns [k0, k0 + kc), straight from the packed weights (rows
// past nr zero), widening lo / hi to their exponent fields, or returns false (then the panel is
// decoded row by row and packed the general way).
// The columns go in groups of up to kGroupPanels panels that share each K step: on AMX one activation
// tile feeds every panel of the group. Each output's sum is over the same panels and K steps in the
// same order whichever tile runs, so the thread count never changes it.
template <typename DecodeRow, typename Out, typename DecodePanel = std::nullptr_t>
void PanelGemm(const float* act, size_t m, size_t k, size_t n_total, float* y, size_t n_begin, size_t n_end,
               const DecodeRow& decode_row, const Out& out, const uint32_t* act_pairs = nullptr, int act_lo = 0,
               int act_hi = 0, const DecodePanel& decode_panel = nullptr) {
  // [kGroupPanels][m rounded up to 16 rows, 16] per thread; grows to the largest m once. The AVX
  // tiles write rows < m only, the AMX tiles whole 16-row tiles.
  thread_local std::vector<float> acc_storage;
  const size_t acc_floats = (m + 15) / 16 * 16 * kPanelCols;
  if (acc_storage.size() < kGroupPanels * acc_floats + 16) acc_storage.resize(kGroupPanels * acc_floats + 16);
  float* acc_base = acc_storage.data();
  acc_base += (16 - (reinterpret_cast<uintptr_t>(acc_base) / sizeof(float)) % 16) % 16;  // 64-byte aligned
  float* acc[kGroupPanels];
  for (size_t j = 0; j < kGroupPanels; ++j) acc[j] = acc_base + j * acc_floats;
  HWY_ALIGN float panel[kPanelK * kPanelCols];
  HWY_ALIGN float row[kPanelK];
  HWY_ALIGN uint32_t panel_pairs[kGroupPanels][kPanelK / 2 * kPanelCols];
  HWY_ALIGN uint32_t row_pairs[kPanelK / 2];
  const bool amx = act_pairs != nullptr && x86::gemm_amx_usable();
  HWY_ALIGN uint32_t tail_pairs[16 * kPanelK / 2];
  std::optional<x86::AmxTiles> amx_tiles;
  if (amx) amx_tiles.emplace();
  // The bf16 tiles' panel of rows [n0, n0 + nr) for one K step, straight from the packed weights or
  // from the decoded rows (each row packed into pairs along k, then placed in its column); false when
  // it cannot take those tiles. Products of nonzero values lie in [2^(act_lo + w_lo - 254),
  // 2^(act_hi + w_hi - 252)): within fp32's normal range, none is flushed or overflows.
  const auto bf16_panel = [&](size_t n0, size_t nr, size_t k0, size_t kc, uint32_t* pairs) {
    int w_lo = 255, w_hi = 0;
    bool direct = false;
    if constexpr (!std::is_same_v<DecodePanel, std::nullptr_t>) direct = decode_panel(n0, nr, k0, kc, pairs, &w_lo, &w_hi);
    if (!direct) {
      w_lo = 255;
      w_hi = 0;
      for (size_t c = 0; c < kPanelCols; ++c) {
        if (c < nr) {
          decode_row(n0 + c, k0, kc, row);
          if (!ToBf16Pairs(row, kc / 2, row_pairs, &w_lo, &w_hi)) return false;
          for (size_t p = 0; p < kc / 2; ++p) pairs[p * kPanelCols + c] = row_pairs[p];
        } else {
          for (size_t p = 0; p < kc / 2; ++p) pairs[p * kPanelCols + c] = 0;
        }
      }
    }
    return act_lo + w_lo - 254 >= -126 && act_hi + w_hi - 252 <= 127;
  };
  // The fp32 tile over the same panel, decoded again as floats.
  const auto fp32_panel_tiles = [&](size_t n0, size_t nr, size_t k0, size_t kc, float* panel_acc) {
    for (size_t c = 0; c < kPanelCols; ++c) {
      if (c < nr) {
        decode_row(n0 + c, k0, kc, row);
        for (size_t kk = 0; kk < kc; ++kk) panel[kk * kPanelCols + c] = row[kk];
      } else {
        for (size_t kk = 0; kk < kc; ++kk) panel[kk * kPanelCols + c] = 0.0f;
      }
    }
    for (size_t m0 = 0; m0 < m; m0 += kTileRows)
      PanelTileRows(std::min(kTileRows, m - m0), act + m0 * k + k0, k, panel, kc, panel_acc + m0 * kPanelCols, k0 == 0);
  };
  for (size_t g0 = n_begin; g0 < n_end; g0 += kGroupPanels * kPanelCols) {
    const size_t n_panels = std::min(kGroupPanels, (n_end - g0 + kPanelCols - 1) / kPanelCols);
    for (size_t k0 = 0; k0 < k; k0 += kPanelK) {
      const size_t kc = std::min(kPanelK, k - k0);
      bool on_bf16[kGroupPanels] = {};
      const uint32_t* bf16_panels[kGroupPanels];
      float* bf16_acc[kGroupPanels];
      size_t n_bf16 = 0;
      for (size_t j = 0; j < n_panels && act_pairs != nullptr; ++j) {
        const size_t n0 = g0 + j * kPanelCols;
        on_bf16[j] = bf16_panel(n0, std::min(kPanelCols, n_end - n0), k0, kc, panel_pairs[j]);
        if (on_bf16[j]) {
          bf16_panels[n_bf16] = panel_pairs[j];
          bf16_acc[n_bf16++] = acc[j];
        }
      }
      if (n_bf16 > 0) Bf16PanelTiles(amx, m, k, k0, kc, act_pairs, bf16_panels, n_bf16, bf16_acc, tail_pairs);
      for (size_t j = 0; j < n_panels; ++j) {
        const size_t n0 = g0 + j * kPanelCols;
        if (!on_bf16[j]) fp32_panel_tiles(n0, std::min(kPanelCols, n_end - n0), k0, kc, acc[j]);
      }
    }
    for (size_t j = 0; j < n_panels; ++j) {
      const size_t n0 = g0 + j * kPanelCols, nr = std::min(kPanelCols, n_end - n0);
      for (size_t r = 0; r < m; ++r)
        for (size_t c = 0; c < nr; ++c) y[r * n_total + n0 + c] = out(acc[j][r * kPanelCols + c]);
    }
  }
}

// The bytes a panel's rows hold for the next K step, into L2 while this step's tiles run (PanelGemm
// visits a column group's panels K step by K step): a panel reads a few lines from each of 16 rows, a
// pattern the hardware prefetcher does not follow, and these loads were most of the panels' decoding
// time. `rows` rows of `bytes` bytes from `first`, `stride` apart; addresses formed as integers, as
// in ops/prefetch.h.
HWY_INLINE void PrefetchPanelRows(const uint8_t* first, size_t rows, size_t stride, size_t bytes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(first);
  for (size_t r = 0; r < rows; ++r)
    for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(reinterpret_cast<const void*>(at + r * stride + b), 0, 2);
}

template <bool kFp4>
void FastBlockGemm(const Fp8Activations& a, const uint8_t* wdata, const uint8_t* wscales, size_t n_total, size_t k,
                   float* y, size_t n_begin, size_t n_end) {
#if HWY_TARGET <= HWY_AVX2
  if (kFp4 && a.m < fast::kFastGemmMinRows && a.fp4_planes.bf16_plane != nullptr) {
    // Laid out for the AVX512-BF16 form (ops/fp4_gemv_x86.h): only on CPUs that have it.
    const size_t words = x86::fp4_bf16_plane_words(k);
    for (size_t m0 = 0; m0 < a.m; m0 += kGemvRows)
      x86::fp4_gemv_bf16(a.fp4_planes.bf16_plane + m0 * words, std::min(kGemvRows, a.m - m0), wdata, wscales, n_total,
                         k, y + m0 * n_total, n_begin, n_end);
    return;
  }
  if (kFp4 && a.m < fast::kFastGemmMinRows && a.fp4_planes.vnni_plane != nullptr) {
    // Planes packed for the AVX512-VNNI kernel (ops/fp4_gemv_x86.h): only on CPUs that have it.
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
    // AVX512-VBMI + BF16 CPUs: the byte-table decode and bf16 dot products (fp8_gemv_x86.h); a group it
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

void FastGemmFp8(const Fp8Activations& a, const Fp8Weight& w, float* y, size_t n_begin, size_t n_end) {
  FastBlockGemm<false>(a, w.codes, w.scales, w.n, w.k, y, n_begin, n_end);
}
void FastGemmFp4(const Fp8Activations& a, const Fp4Weight& w, float* y, size_t n_begin, size_t n_end) {
  FastBlockGemm<true>(a, w.packed, w.scales, w.n, w.k, y, n_begin, n_end);
}

// ---- dense weights (bf16 bits, f32) --------------------------------------------------------------

HWY_INLINE VW LoadWeights(DW df, const uint16_t* p) {
  const hn::RebindToUnsigned<DW> du;
  const hn::Rebind<uint16_t, DW> d16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
}
HWY_INLINE VW LoadWeights(DW df, const float* p) { return hn::LoadU(df, p); }
HWY_INLINE float WeightAt(const uint16_t* p, size_t i) { return bf16_bits_to_f32(p[i]); }
HWY_INLINE float WeightAt(const float* p, size_t i) { return p[i]; }

// The bf16 GEMV without widening: a vector of 2N bf16 weights read as N u32 lanes holds element 2j
// in lane j's low half and 2j+1 in its high half, so masking the low halves gives the odd elements
// as f32 and shifting left by 16 the even ones (two instructions per 2N weights instead of two
// widening loads and shifts). The activations are split once per call into matching even and odd
// halves per chunk of 2N. Exact products as before; the lanes add in a different order.
#if HWY_TARGET != HWY_SCALAR
template <size_t R>
HWY_NOINLINE void Bf16GemvTile(const float* x, size_t k, const uint16_t* w, size_t n_total, float* y, bool bf16_out,
                               size_t n_begin, size_t n_end) {
  const DW df;
  const hn::RebindToUnsigned<DW> du;
  const size_t lanes = hn::Lanes(df);
  const size_t chunk = 2 * lanes, whole = k - k % chunk;
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "bf16 pairs are read as u32 lanes, low half first");
  thread_local std::vector<float> split;  // [R, whole]: per chunk, even elements then odd ones
  if (split.size() < R * whole) split.resize(R * whole);
  for (size_t r = 0; r < R; ++r)
    for (size_t i = 0; i < whole; i += chunk) {
      VW even, odd;
      hn::LoadInterleaved2(df, x + r * k + i, even, odd);
      hn::StoreU(even, df, split.data() + r * whole + i);
      hn::StoreU(odd, df, split.data() + r * whole + i + lanes);
    }
  const hn::Repartition<uint16_t, decltype(du)> d16;
  const auto high = hn::Set(du, 0xFFFF0000u);
  for (size_t n = n_begin; n < n_end; ++n) {
    const uint16_t* wrow = w + n * k;
    VW acc0[R], acc1[R];
    for (size_t r = 0; r < R; ++r) acc0[r] = acc1[r] = hn::Zero(df);
    for (size_t i = 0; i < whole; i += chunk) {
      PrefetchLine(wrow + i);
      const auto pairs = hn::BitCast(du, hn::LoadU(d16, wrow + i));
      const VW even = hn::BitCast(df, hn::ShiftLeft<16>(pairs));
      const VW odd = hn::BitCast(df, hn::And(pairs, high));
      for (size_t r = 0; r < R; ++r) {
        acc0[r] = hn::MulAdd(hn::LoadU(df, split.data() + r * whole + i), even, acc0[r]);
        acc1[r] = hn::MulAdd(hn::LoadU(df, split.data() + r * whole + i + lanes), odd, acc1[r]);
      }
    }
    for (size_t r = 0; r < R; ++r) {
      float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0[r], acc1[r])));
      for (size_t j = whole; j < k; ++j) s += x[r * k + j] * bf16_bits_to_f32(wrow[j]);
      y[r * n_total + n] = bf16_out ? round_bf16(s) : s;
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

template <size_t R, typename W>
HWY_NOINLINE void DenseGemvTile(const float* x, size_t k, const W* w, size_t n_total, float* y, bool bf16_out,
                                size_t n_begin, size_t n_end) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<W, uint16_t>) {
    Bf16GemvTile<R>(x, k, w, n_total, y, bf16_out, n_begin, n_end);
    return;
  }
#endif
  const DW df;
  const size_t lanes = hn::Lanes(df);
  for (size_t n = n_begin; n < n_end; ++n) {
    const W* wrow = w + n * k;
    VW acc0[R], acc1[R];
    for (size_t r = 0; r < R; ++r) acc0[r] = acc1[r] = hn::Zero(df);
    size_t i = 0;
    for (; i + 2 * lanes <= k; i += 2 * lanes) {
      for (size_t b = 0; b < 2 * lanes * sizeof(W); b += 64) PrefetchLine(reinterpret_cast<const uint8_t*>(wrow + i) + b);
      const VW w0 = LoadWeights(df, wrow + i);
      const VW w1 = LoadWeights(df, wrow + i + lanes);
      for (size_t r = 0; r < R; ++r) {
        acc0[r] = hn::MulAdd(hn::LoadU(df, x + r * k + i), w0, acc0[r]);
        acc1[r] = hn::MulAdd(hn::LoadU(df, x + r * k + i + lanes), w1, acc1[r]);
      }
    }
    for (size_t r = 0; r < R; ++r) {
      float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0[r], acc1[r])));
      for (size_t j = i; j < k; ++j) s += x[r * k + j] * WeightAt(wrow, j);
      y[r * n_total + n] = bf16_out ? round_bf16(s) : s;
    }
  }
}

// x_pairs (may be nullptr): x as bf16 pairs (ToBf16Pairs; exponent fields x_lo..x_hi), for the
// AVX512-BF16 tile.
template <typename W>
void DenseGemm(const float* x, size_t m, size_t k, const W* w, size_t n_total, float* y, bool bf16_out,
               size_t n_begin, size_t n_end, const uint32_t* x_pairs = nullptr, int x_lo = 0, int x_hi = 0) {
  if (m < fast::kFastGemmMinRows) {
    size_t m0 = 0;
    for (; m0 + kGemvRows <= m; m0 += kGemvRows)
      DenseGemvTile<kGemvRows>(x + m0 * k, k, w, n_total, y + m0 * n_total, bf16_out, n_begin, n_end);
    const float* xm = x + m0 * k;
    float* ym = y + m0 * n_total;
    switch (m - m0) {
      case 3: DenseGemvTile<3>(xm, k, w, n_total, ym, bf16_out, n_begin, n_end); break;
      case 2: DenseGemvTile<2>(xm, k, w, n_total, ym, bf16_out, n_begin, n_end); break;
      case 1: DenseGemvTile<1>(xm, k, w, n_total, ym, bf16_out, n_begin, n_end); break;
      default: break;
    }
    return;
  }
  const DW df;
  const size_t lanes = hn::Lanes(df);
  const auto decode_row = [&](size_t n, size_t k0, size_t kc, float* dst) {
    const W* src = w + n * k + k0;
    size_t i = 0;
    for (; i + lanes <= kc; i += lanes) hn::StoreU(LoadWeights(df, src + i), df, dst + i);
    for (; i < kc; ++i) dst[i] = WeightAt(src, i);
  };
  if (bf16_out) {
    PanelGemm(x, m, k, n_total, y, n_begin, n_end, decode_row, [](float v) { return round_bf16(v); }, x_pairs, x_lo,
              x_hi);
  } else {
    PanelGemm(x, m, k, n_total, y, n_begin, n_end, decode_row, [](float v) { return v; }, x_pairs, x_lo, x_hi);
  }
}

void FastLinearBf16(const float* x, size_t m, const Bf16Weight& w, float* y, bool bf16_out, size_t n_begin,
                    size_t n_end, const uint32_t* x_pairs, int x_lo, int x_hi) {
  DenseGemm(x, m, w.k, w.bits, w.n, y, bf16_out, n_begin, n_end, x_pairs, x_lo, x_hi);
}
void FastLinearF32(const float* x, size_t m, const F32Weight& w, float* y, size_t n_begin, size_t n_end) {
  DenseGemm(x, m, w.k, w.data, w.n, y, false, n_begin, n_end);
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
HWY_EXPORT(FastLinearBf16);
HWY_EXPORT(FastLinearF32);
HWY_EXPORT(ToBf16Pairs);

namespace fast {
// values [m, k] + scales [m, k/32], for GEMM-sized m the bf16 pairs [m, k/2], and for GEMV-sized m
// the FP4 integer planes (Fp4GemvPlanes:
// plane and residual plane int16 [m, k/32, 32] each, factor and residual blocks [m, k/32], counts [m]).
// The byte planes of the AVX512-VNNI FP4 kernel (ops/fp4_gemv_x86.h) take 64 bytes per padded block
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
Fp8Activations quantize(const float* x, size_t m, size_t k, std::span<float> scratch, bool fp4_planes) {
  CEDAR_CHECK(k % kFp8ActBlock == 0, "activation width %zu is not a multiple of 32", k);
  CEDAR_CHECK(scratch.size() >= act_scratch_floats(m, k), "linear scratch too small: %zu < %zu", scratch.size(),
              act_scratch_floats(m, k));
  float* values = scratch.data();          // [m, k]
  float* scales = scratch.data() + m * k;  // [m, k/32]
  Fp8Activations a{values, scales, m, k};
  a.dequantized = true;
  if (fp4_planes && m < kFastGemmMinRows) {
    a.fp4_planes = quantize_fp4_planes(x, m, k, values, scales, scales + m * (k / kFp8ActBlock));
    return a;
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
  return a;
}

}  // namespace

Fp8Activations quantize_activations(const float* x, size_t m, size_t k, std::span<float> scratch) {
  return quantize(x, m, k, scratch, true);
}

void gemm_fp8(const Fp8Activations& a, const Fp8Weight& w, float* y, ThreadPool* pool) {
  CEDAR_CHECK(a.dequantized, "fast::gemm_fp8 needs activations from fast::quantize_activations");
  CEDAR_CHECK(a.k == w.k && w.k % 32 == 0, "gemm_fp8: activation k %zu vs weight k %zu (multiple of 32)", a.k,
              w.k);
  for_rows(pool, w.n, [&](size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(FastGemmFp8)(a, w, y, b, e); }, 32);
}

void gemm_fp4(const Fp8Activations& a, const Fp4Weight& w, float* y, ThreadPool* pool) {
  CEDAR_CHECK(a.dequantized, "fast::gemm_fp4 needs activations from fast::quantize_activations");
  CEDAR_CHECK(a.k == w.k && w.k % 32 == 0, "gemm_fp4: activation k %zu vs weight k %zu (multiple of 32)", a.k,
              w.k);
  for_rows(pool, w.n, [&](size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(FastGemmFp4)(a, w, y, b, e); });
}

Fp8Activations quantize_activations_fp8(const float* x, size_t m, size_t k, std::span<float> scratch) {
  return quantize(x, m, k, scratch, false);
}

void gemm_fp8_rows(const Fp8Activations& a, const Fp8Weight& w, float* y, size_t n_begin, size_t n_end) {
  CEDAR_CHECK(a.dequantized && a.k == w.k && w.k % 32 == 0,
              "fast::gemm_fp8_rows: activations from fast::quantize_activations, k %zu", w.k);
  HWY_DYNAMIC_DISPATCH(FastGemmFp8)(a, w, y, n_begin, n_end);
}

void gemm_fp4_rows(const Fp8Activations& a, const Fp4Weight& w, float* y, size_t n_begin, size_t n_end) {
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

void linear_bf16(const float* x, size_t m, const Bf16Weight& w, float* y, LinearOut out, ThreadPool* pool) {
  const bool bf16_out = out == LinearOut::kBf16;
  if (w.coded != nullptr && m < kFastGemmMinRows) {
    // The activations in the kernel's lane order once, before the threads split the rows.
    thread_local std::vector<float> permuted;  // grown once
    if (permuted.size() < m * w.k) permuted.resize(m * w.k);
    bf16_coded_permute(x, m, w.k, permuted.data());
    // Named here: inside the lambda `permuted` would be the running thread's own thread_local.
    const float* xp = permuted.data();
    for_rows(pool, w.n, [&](size_t b, size_t e) { bf16_coded_gemv_permuted(xp, m, *w.coded, y, bf16_out, b, e); });
    return;
  }
  // A GEMM whose activations are bf16 values runs on the AVX512-BF16 tile where the CPU has it: x is
  // packed into pairs once here, before the threads split the rows (a thread's buffer, grown once).
  const uint32_t* x_pairs = nullptr;
  int x_lo = 255, x_hi = 0;
  if (m >= kFastGemmMinRows && w.k % 32 == 0 && x86::gemm_bf16_usable()) {
    thread_local std::vector<uint32_t> pairs;
    if (pairs.size() < m * w.k / 2) pairs.resize(m * w.k / 2);
    if (HWY_DYNAMIC_DISPATCH(ToBf16Pairs)(x, m * w.k / 2, pairs.data(), &x_lo, &x_hi)) x_pairs = pairs.data();
  }
  for_rows(pool, w.n, [&](size_t b, size_t e) {
    HWY_DYNAMIC_DISPATCH(FastLinearBf16)(x, m, w, y, bf16_out, b, e, x_pairs, x_lo, x_hi);
  });
}

void linear_f32(const float* x, size_t m, const F32Weight& w, float* y, ThreadPool* pool) {
  for_rows(pool, w.n, [&](size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(FastLinearF32)(x, m, w, y, b, e); });
}

void linear_fp8_bf16_rows(const Fp8Activations& x, const Fp8Weight& w, float* y, LinearOut out, size_t n_begin,
                          size_t n_end) {
  CEDAR_CHECK(w.k % 32 == 0, "linear_fp8_bf16: k %zu is not a multiple of 32", w.k);
  CEDAR_CHECK(x.k == w.k, "linear_fp8_bf16: x has %zu columns, the weight %zu", x.k, w.k);
  // The FP8 GEMMs read `values` as given when dequantized: x itself, unquantised. They round to bf16;
  // an f32 output needs the unrounded sums, which only bf16 output (wo_a) uses here.
  CEDAR_CHECK(out == LinearOut::kBf16, "fast::linear_fp8_bf16 supports bf16 output only");
  Fp8Activations a{x.values, nullptr, x.m, w.k};
  a.dequantized = true;
  a.bf16_pairs = x.bf16_pairs;
  a.bf16_exp_lo = x.bf16_exp_lo;
  a.bf16_exp_hi = x.bf16_exp_hi;
  HWY_DYNAMIC_DISPATCH(FastGemmFp8)(a, w, y, n_begin, n_end);
}

bool pair_unquantized(Fp8Activations* a, uint32_t* pairs) {
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
  Fp8Activations a{x, nullptr, m, w.k};
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
