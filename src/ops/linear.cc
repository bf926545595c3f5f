// Fast paths of linear.h: Highway kernels compiled for every enabled x86 target and chosen at run
// time (HWY_DYNAMIC_DISPATCH). The FP8/FP4 kernels are bit-identical to ref::gemm_fp8/gemm_fp4 (same
// canonical in-block order, exact products, same per-block scale order); see linear.h.
#include "ops/linear.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/formats.h"
#include "ops/linear_internal.h"
#include "ops/quant.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "ops/dot-inl.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 8 f32 lanes: the canonical block order has 8 lane sums, so wider vectors are not used here
// (on AVX-512 targets this is a 256-bit vector).
using DF8 = hn::CappedTag<float, 8>;
using VF8 = hn::Vec<DF8>;
constexpr size_t kMaxVecPerBlock = 32;  // 32 elements / 1 lane (HWY_SCALAR)
constexpr size_t kRowTile = 16;         // activation rows sharing one decoded weight block

// The 8 lane sums stored in lane order -> the canonical tree of block_dot32_canonical.
HWY_INLINE float Reduce8(const float* s) {
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

// N E4M3 codes -> f32 value * 2^-120, by moving the exponent/mantissa bits into f32 position: a normal
// code gets f32 exponent e (bias 127 instead of 7) and a subnormal code becomes the f32 subnormal
// m * 2^-129, so every code maps to exactly value * 2^-120 (0x7F/0xFF give 480 * 2^-120, not NaN).
HWY_INLINE VF8 DecodeE4m3Scaled(DF8 df, const uint8_t* p) {
  const hn::RebindToSigned<DF8> di;
  const hn::Rebind<uint8_t, DF8> d8;
  // code << 24 puts the sign at bit 31 and exponent/mantissa at 30..24; an arithmetic shift by 4 moves
  // them to 26..20 (sign smeared over 30..27), and the mask keeps sign + 7 value bits.
  const auto b = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF8>(), hn::LoadU(d8, p)));
  const auto moved = hn::ShiftRight<4>(hn::ShiftLeft<24>(b));
  return hn::BitCast(df, hn::And(moved, hn::Set(di, static_cast<int32_t>(0x87F00000u))));
}
constexpr float kE4m3Unscale = 0x1p120f;

// N E2M1 codes starting at element `first` (packed two per byte, even element low) -> f32 value *
// 2^-126: code bits e,m go to f32 exponent/mantissa-top, so normal codes get exponent bias 127 instead
// of 1 and the subnormal code 1 (0.5) becomes 2^-127. Exact for every code.
HWY_INLINE VF8 DecodeE2m1Scaled(DF8 df, const uint8_t* packed, size_t first) {
  const hn::RebindToUnsigned<DF8> du;
  const hn::RebindToSigned<DF8> di;
  const size_t n = hn::Lanes(df);
  hn::Vec<decltype(du)> top;  // the lane's nibble in bits 31..28 (lower bits: other nibbles)
  if (n >= 2) {
    uint32_t word = 0;
    std::memcpy(&word, packed + first / 2, n / 2);  // n/2 <= 4 bytes, little-endian nibble order
    // Lane l holds nibble l: shift it left by 28 - 4l.
    const auto shifts = hn::Sub(hn::Set(du, 28u), hn::ShiftLeft<2>(hn::Iota(du, 0)));
    top = hn::Set(du, word) << shifts;
  } else {
    const uint8_t byte = packed[first / 2];
    top = hn::Set(du, static_cast<uint32_t>((first & 1) ? (byte >> 4) : (byte & 0xF)) << 28);
  }
  // Arithmetic shift by 6: sign stays at bit 31, e and m land in bits 24..22; mask off the rest.
  const auto moved = hn::ShiftRight<6>(hn::BitCast(di, top));
  return hn::BitCast(df, hn::And(moved, hn::Set(di, static_cast<int32_t>(0x81C00000u))));
}
constexpr float kE2m1Unscale = 0x1p126f;

// Folds the 8 canonical lane sums held in acc (8/N vectors) with the canonical tree.
template <class D>
HWY_INLINE float ReduceLaneSums(D d, const hn::Vec<D>* acc) {
#if HWY_TARGET != HWY_SCALAR
  constexpr size_t kLanes = hn::MaxLanes(D());
  if constexpr (kLanes == 8 || kLanes == 4) {
    // t_l = s_l + s_{l+4}; then (t0 + t2) + (t1 + t3) via two shuffles.
    const auto finish = [](auto t) {
      const auto u = hn::Add(t, hn::Shuffle1032(t));  // lanes 0, 1: t0 + t2, t1 + t3
      return hn::GetLane(hn::Add(u, hn::Shuffle2301(u)));
    };
    if constexpr (kLanes == 8) {
      const hn::Half<D> dh;
      return finish(hn::Add(hn::LowerHalf(dh, acc[0]), hn::UpperHalf(dh, acc[0])));
    } else {
      return finish(hn::Add(acc[0], acc[1]));
    }
  }
#endif
  const size_t n = hn::Lanes(d);
  HWY_ALIGN float lanes[8];
  for (size_t g = 0; g < 8 / n; ++g) hn::Store(acc[g], d, lanes + n * g);
  return Reduce8(lanes);
}

// Canonical block dot of 32 activation values with 32 decoded weights held in `wv` (vector v covers
// elements 8*(v / G) + N*(v % G) .. +N-1, G = 8/N).
HWY_INLINE float BlockDot(DF8 df, const float* act, const VF8* wv) {
  const size_t n = hn::Lanes(df);
  const size_t groups = 8 / n;
  VF8 acc[8];
  for (size_t g = 0; g < groups; ++g) acc[g] = hn::Zero(df);
  for (size_t step = 0; step < 4; ++step) {
    for (size_t g = 0; g < groups; ++g) {
      acc[g] = hn::MulAdd(hn::LoadU(df, act + 8 * step + n * g), wv[step * groups + g], acc[g]);
    }
  }
  return ReduceLaneSums(df, acc);
}

template <bool kFp4>
void BlockGemmRows(const Fp8Activations& a, const uint8_t* wdata, const uint8_t* wscales, size_t n_total,
                   size_t k, float* y, size_t n_begin, size_t n_end) {
  const DF8 df;
  const size_t lanes = hn::Lanes(df);
  const size_t groups = 8 / lanes;
  const size_t kblocks = k / 32;
  const float* e8m0 = e8m0_table();
  VF8 wv[kMaxVecPerBlock];
  float acc[kRowTile];
  for (size_t m0 = 0; m0 < a.m; m0 += kRowTile) {
    const size_t rows = std::min(kRowTile, a.m - m0);
    for (size_t n = n_begin; n < n_end; ++n) {
      for (size_t r = 0; r < rows; ++r) acc[r] = 0.0f;
      for (size_t kb = 0; kb < kblocks; ++kb) {
        float sw;
        if constexpr (kFp4) {
          const uint8_t* row = wdata + n * (k / 2) + kb * 16;
          for (size_t step = 0; step < 4; ++step)
            for (size_t g = 0; g < groups; ++g)
              wv[step * groups + g] = DecodeE2m1Scaled(df, row, 8 * step + lanes * g);
          sw = e8m0[wscales[n * kblocks + kb]];
        } else {
          const uint8_t* row = wdata + n * k + kb * 32;
          for (size_t step = 0; step < 4; ++step)
            for (size_t g = 0; g < groups; ++g)
              wv[step * groups + g] = DecodeE4m3Scaled(df, row + 8 * step + lanes * g);
          sw = e8m0[wscales[(n / 32) * kblocks + kb]];
        }
        for (size_t r = 0; r < rows; ++r) {
          const size_t m = m0 + r;
          float part = BlockDot(df, a.values + m * k + kb * 32, wv);
          part *= kFp4 ? kE2m1Unscale : kE4m3Unscale;  // exact: back to the unscaled partial
          acc[r] += (part * a.scales[m * kblocks + kb]) * sw;
        }
      }
      for (size_t r = 0; r < rows; ++r) y[(m0 + r) * n_total + n] = round_bf16(acc[r]);
    }
  }
}

// Multi-row path: 16 activation rows per tile, one f32 lane per row, so each lane computes the
// canonical block dot of its own row (lane chains over l, l+8, l+16, l+24, then the same tree) with
// the weight broadcast: exactly the order of BlockDot / block_dot32_canonical, without per-row
// horizontal reductions. Weight rows are processed in chunks that stay in cache across tiles.
using DT = hn::CappedTag<float, kActTileRows>;
using VT = hn::Vec<DT>;
constexpr size_t kWeightChunk = 16;

template <bool kFp4>
void BlockGemmTiles(const Fp8Activations& a, const uint8_t* wdata, const uint8_t* wscales, size_t n_total,
                    size_t k, float* y, size_t n_begin, size_t n_end) {
  const DF8 df;
  const DT dt;
  const size_t lanes8 = hn::Lanes(df);
  const size_t groups = 8 / lanes8;
  const size_t nt = hn::Lanes(dt);
  const size_t nv = kActTileRows / nt;  // vectors per tile row group (1 on AVX-512)
  const size_t kblocks = k / 32;
  const size_t tiles = (a.m + kActTileRows - 1) / kActTileRows;
  const float* e8m0 = e8m0_table();
  const float unscale = kFp4 ? kE2m1Unscale : kE4m3Unscale;
  HWY_ALIGN float w[32];  // one decoded (scaled) weight block
  for (size_t n0 = n_begin; n0 < n_end; n0 += kWeightChunk) {
    const size_t n1 = std::min(n_end, n0 + kWeightChunk);
    for (size_t t = 0; t < tiles; ++t) {
      const float* at = a.values_t + t * k * kActTileRows;       // [k, 16]
      const float* st = a.scales_t + t * kblocks * kActTileRows;  // [kblocks, 16]
      for (size_t n = n0; n < n1; ++n) {
        VT acc[kActTileRows];
        for (size_t v = 0; v < nv; ++v) acc[v] = hn::Zero(dt);
        for (size_t kb = 0; kb < kblocks; ++kb) {
          float sw;
          if constexpr (kFp4) {
            const uint8_t* row = wdata + n * (k / 2) + kb * 16;
            for (size_t step = 0; step < 4; ++step)
              for (size_t g = 0; g < groups; ++g)
                hn::Store(DecodeE2m1Scaled(df, row, 8 * step + lanes8 * g), df, w + 8 * step + lanes8 * g);
            sw = e8m0[wscales[n * kblocks + kb]];
          } else {
            const uint8_t* row = wdata + n * k + kb * 32;
            for (size_t step = 0; step < 4; ++step)
              for (size_t g = 0; g < groups; ++g)
                hn::Store(DecodeE4m3Scaled(df, row + 8 * step + lanes8 * g), df, w + 8 * step + lanes8 * g);
            sw = e8m0[wscales[(n / 32) * kblocks + kb]];
          }
          const float* ab = at + kb * 32 * kActTileRows;  // [32, 16] this block's activations
          const auto swv = hn::Set(dt, sw);
          const auto unv = hn::Set(dt, unscale);
          for (size_t v = 0; v < nv; ++v) {
            VT s[8];
            for (size_t l = 0; l < 8; ++l) {
              s[l] = hn::Mul(hn::LoadU(dt, ab + l * kActTileRows + v * nt), hn::Set(dt, w[l]));
              for (size_t step = 1; step < 4; ++step) {
                const size_t e = l + 8 * step;
                s[l] = hn::MulAdd(hn::LoadU(dt, ab + e * kActTileRows + v * nt), hn::Set(dt, w[e]), s[l]);
              }
            }
            VT part = hn::Add(hn::Add(hn::Add(s[0], s[4]), hn::Add(s[2], s[6])),
                              hn::Add(hn::Add(s[1], s[5]), hn::Add(s[3], s[7])));
            part = hn::Mul(part, unv);  // exact
            const VT sa = hn::LoadU(dt, st + kb * kActTileRows + v * nt);
            acc[v] = hn::Add(acc[v], hn::Mul(hn::Mul(part, sa), swv));
          }
        }
        HWY_ALIGN float out[kActTileRows];
        for (size_t v = 0; v < nv; ++v) hn::Store(acc[v], dt, out + v * nt);
        for (size_t r = 0; r < kActTileRows && t * kActTileRows + r < a.m; ++r) {
          y[(t * kActTileRows + r) * n_total + n] = round_bf16(out[r]);
        }
      }
    }
  }
}

void GemmFp8Rows(const Fp8Activations& a, const Fp8Weight& w, float* y, size_t n_begin, size_t n_end) {
  if (a.values_t != nullptr && a.m >= kActTileMinRows) {
    BlockGemmTiles<false>(a, w.codes, w.scales, w.n, w.k, y, n_begin, n_end);
  } else {
    BlockGemmRows<false>(a, w.codes, w.scales, w.n, w.k, y, n_begin, n_end);
  }
}
void GemmFp4Rows(const Fp8Activations& a, const Fp4Weight& w, float* y, size_t n_begin, size_t n_end) {
  if (a.values_t != nullptr && a.m >= kActTileMinRows) {
    BlockGemmTiles<true>(a, w.packed, w.scales, w.n, w.k, y, n_begin, n_end);
  } else {
    BlockGemmRows<true>(a, w.packed, w.scales, w.n, w.k, y, n_begin, n_end);
  }
}

void LinearBf16Rows(const float* x, size_t m, const Bf16Weight& w, float* y, LinearOut out, size_t n_begin,
                    size_t n_end) {
  for (size_t n = n_begin; n < n_end; ++n) {
    const uint16_t* wrow = w.bits + n * w.k;
    for (size_t i = 0; i < m; ++i) {
      const float v = DotCanonical<false>(x + i * w.k, wrow, w.k);
      y[i * w.n + n] = out == LinearOut::kBf16 ? round_bf16(v) : v;
    }
  }
}

void LinearF32Rows(const float* x, size_t m, const F32Weight& w, float* y, size_t n_begin, size_t n_end) {
  for (size_t n = n_begin; n < n_end; ++n) {
    const float* wrow = w.data + n * w.k;
    for (size_t i = 0; i < m; ++i) y[i * w.n + n] = DotCanonical<false>(x + i * w.k, wrow, w.k);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace cedar::ops {

HWY_EXPORT(GemmFp8Rows);
HWY_EXPORT(GemmFp4Rows);
HWY_EXPORT(LinearBf16Rows);
HWY_EXPORT(LinearF32Rows);

namespace {

// Splits [0, n) over the pool; grain keeps chunks large enough to amortise the hand-off.
template <typename Fn>
void for_rows(ThreadPool* pool, size_t n, Fn&& fn) {
  if (pool == nullptr || pool->size() <= 1 || n < 64) {
    fn(size_t{0}, n);
    return;
  }
  pool->parallel_for(n, 16, [&](size_t begin, size_t end, int) { fn(begin, end); });
}

}  // namespace

void gemm_fp8(const Fp8Activations& a, const Fp8Weight& w, float* y, ThreadPool* pool) {
  CEDAR_CHECK(a.k == w.k && w.k % 32 == 0, "gemm_fp8: activation k %zu vs weight k %zu (multiple of 32)", a.k,
              w.k);
  for_rows(pool, w.n, [&](size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(GemmFp8Rows)(a, w, y, b, e); });
}

void gemm_fp4(const Fp8Activations& a, const Fp4Weight& w, float* y, ThreadPool* pool) {
  CEDAR_CHECK(a.k == w.k && w.k % 32 == 0, "gemm_fp4: activation k %zu vs weight k %zu (multiple of 32)", a.k,
              w.k);
  for_rows(pool, w.n, [&](size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(GemmFp4Rows)(a, w, y, b, e); });
}

void linear_fp8(const float* x, size_t m, const Fp8Weight& w, float* y, std::span<float> scratch,
                ThreadPool* pool) {
  gemm_fp8(quantize_activations(x, m, w.k, scratch), w, y, pool);
}

void linear_fp4(const float* x, size_t m, const Fp4Weight& w, float* y, std::span<float> scratch,
                ThreadPool* pool) {
  gemm_fp4(quantize_activations(x, m, w.k, scratch), w, y, pool);
}

void linear_bf16(const float* x, size_t m, const Bf16Weight& w, float* y, LinearOut out, ThreadPool* pool) {
  for_rows(pool, w.n, [&](size_t b, size_t e) {
    HWY_DYNAMIC_DISPATCH(LinearBf16Rows)(x, m, w, y, out, b, e);
  });
}

void linear_f32(const float* x, size_t m, const F32Weight& w, float* y, ThreadPool* pool) {
  for_rows(pool, w.n, [&](size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(LinearF32Rows)(x, m, w, y, b, e); });
}

}  // namespace cedar::ops
#endif  // HWY_ONCE
