// Fast paths of linear.h: Highway kernels compiled for every enabled x86 target and chosen at run
// time (HWY_DYNAMIC_DISPATCH). The FP8/FP4 kernels are bit-identical to ref::gemm_fp8/gemm_fp4 (exact
// block partials rounded once, same per-block scale order); the bf16/f32 kernels use the canonical
// float64 dot of dot_canonical.h. See linear.h.
#include "ops/linear/linear.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/linear/activation_access.h"
#include "ops/formats/formats.h"
#include "ops/linear/linear_internal.h"
#include "ops/formats/quant.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear/linear_exact.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "ops/simd/dot-inl.h"
#include "ops/linear/weight_decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

HWY_INLINE const uint8_t* BlockBytes(bool fp4, const uint8_t* wdata, size_t k, size_t n, size_t kb) {
  return fp4 ? wdata + n * (k / 2) + kb * 16 : wdata + n * k + kb * 32;
}

// The block partial of block_dot32_exact: the fp32 products (exact) promoted to f64 and summed (exact
// in any order), unscaled (a power of two, exact), rounded once to fp32.
HWY_INLINE float BlockPartial(const float* act, const VW* wv, double unscale) {
  const DW df;
  double sum;
#if HWY_TARGET == HWY_SCALAR
  sum = 0.0;
  for (size_t g = 0; g < 32; ++g) sum += static_cast<double>(hn::GetLane(hn::Mul(hn::LoadU(df, act + g), wv[g])));
#else
  {
    const size_t lanes = hn::Lanes(df);
    const hn::Half<DW> dh;
    const hn::Rebind<double, decltype(dh)> dd;
    auto acc0 = hn::Zero(dd);
    auto acc1 = hn::Zero(dd);
    for (size_t g = 0; g < 32 / lanes; ++g) {
      const VW p = hn::Mul(hn::LoadU(df, act + lanes * g), wv[g]);
      acc0 = hn::Add(acc0, hn::PromoteTo(dd, hn::LowerHalf(dh, p)));
      acc1 = hn::Add(acc1, hn::PromoteTo(dd, hn::UpperHalf(dh, p)));
    }
    sum = hn::GetLane(hn::SumOfLanes(dd, hn::Add(acc0, acc1)));
  }
#endif
  return static_cast<float>(sum * unscale);
}

template <bool kFp4>
void BlockGemmRows(const ActivationLayout& a, const uint8_t* wdata, const uint8_t* wscales, size_t n_total,
                   size_t k, float* y, size_t n_begin, size_t n_end) {
  const size_t kblocks = k / 32;
  const float* e8m0 = e8m0_table();
  const double unscale = kFp4 ? kE2m1Unscale : kE4m3Unscale;
  constexpr size_t kRowTile = 16;  // activation rows sharing one decoded weight block
  VW wv[kMaxVecPerBlock];
  float acc[kRowTile];
  for (size_t m0 = 0; m0 < a.m; m0 += kRowTile) {
    const size_t rows = std::min(kRowTile, a.m - m0);
    for (size_t n = n_begin; n < n_end; ++n) {
      for (size_t r = 0; r < rows; ++r) acc[r] = 0.0f;
      for (size_t kb = 0; kb < kblocks; ++kb) {
        DecodeBlock<kFp4>(BlockBytes(kFp4, wdata, k, n, kb), wv);
        const float sw = kFp4 ? e8m0[wscales[n * kblocks + kb]] : e8m0[wscales[(n / 32) * kblocks + kb]];
        for (size_t r = 0; r < rows; ++r) {
          const size_t m = m0 + r;
          const float part = BlockPartial(a.values + m * k + kb * 32, wv, unscale);
          acc[r] += (part * a.scales[m * kblocks + kb]) * sw;
        }
      }
      for (size_t r = 0; r < rows; ++r) y[(m0 + r) * n_total + n] = round_bf16(acc[r]);
    }
  }
}

// Multi-row path: 16 activation rows per tile, one f64 lane per row, so each lane sums the exact block
// products of its own row with the weight broadcast (promoted activation x f64 weight: exact, so the
// fused add is exact too): no per-row horizontal reduction. Weight rows are processed in chunks that
// stay in cache across tiles.
using DD = hn::CappedTag<double, 8>;
using DH = hn::Rebind<float, DD>;
constexpr size_t kWeightChunk = 16;

template <bool kFp4>
void BlockGemmTiles(const ActivationLayout& a, const uint8_t* wdata, const uint8_t* wscales, size_t n_total,
                    size_t k, float* y, size_t n_begin, size_t n_end) {
  const DD dd;
  const DH dh;
  const size_t lanes = hn::Lanes(dh);
  const size_t nv = kActTileRows / lanes;  // vectors per tile (2 on AVX-512, 4 on AVX2)
  const size_t kblocks = k / 32;
  const size_t tiles = (a.m + kActTileRows - 1) / kActTileRows;
  const float* e8m0 = e8m0_table();
  const double unscale = kFp4 ? kE2m1Unscale : kE4m3Unscale;
  const size_t wlanes = hn::Lanes(DW());
  VW wv[kMaxVecPerBlock];
  HWY_ALIGN float w[32];    // one decoded (scaled) weight block
  HWY_ALIGN double wd[32];  // the same, widened once for the f64 broadcasts
  for (size_t n0 = n_begin; n0 < n_end; n0 += kWeightChunk) {
    const size_t n1 = std::min(n_end, n0 + kWeightChunk);
    for (size_t t = 0; t < tiles; ++t) {
      const float* at = a.values_t + t * k * kActTileRows;       // [k, 16]
      const float* st = a.scales_t + t * kblocks * kActTileRows;  // [kblocks, 16]
      for (size_t n = n0; n < n1; ++n) {
        hn::Vec<DH> acc[kActTileRows];  // [16 rows] fp32 K-order accumulators
        for (size_t v = 0; v < nv; ++v) acc[v] = hn::Zero(dh);
        for (size_t kb = 0; kb < kblocks; ++kb) {
          DecodeBlock<kFp4>(BlockBytes(kFp4, wdata, k, n, kb), wv);
          for (size_t g = 0; g < 32 / wlanes; ++g) hn::Store(wv[g], DW(), w + wlanes * g);
          for (size_t e = 0; e < 32; ++e) wd[e] = w[e];
          const float sw = kFp4 ? e8m0[wscales[n * kblocks + kb]] : e8m0[wscales[(n / 32) * kblocks + kb]];
          const float* ab = at + kb * 32 * kActTileRows;  // [32, 16] this block's activations
          const auto swv = hn::Set(dh, sw);
          for (size_t v = 0; v < nv; ++v) {
            auto s0 = hn::Zero(dd);  // even elements
            auto s1 = hn::Zero(dd);  // odd elements (a second chain for latency)
            for (size_t e = 0; e < 32; e += 2) {
              s0 = hn::MulAdd(hn::PromoteTo(dd, hn::LoadU(dh, ab + e * kActTileRows + v * lanes)), hn::Set(dd, wd[e]),
                              s0);
              s1 = hn::MulAdd(hn::PromoteTo(dd, hn::LoadU(dh, ab + (e + 1) * kActTileRows + v * lanes)),
                              hn::Set(dd, wd[e + 1]), s1);
            }
            const auto part = hn::DemoteTo(dh, hn::Mul(hn::Add(s0, s1), hn::Set(dd, unscale)));
            const auto sa = hn::LoadU(dh, st + kb * kActTileRows + v * lanes);
            acc[v] = hn::Add(acc[v], hn::Mul(hn::Mul(part, sa), swv));
          }
        }
        HWY_ALIGN float out[kActTileRows];
        for (size_t v = 0; v < nv; ++v) hn::Store(acc[v], dh, out + v * lanes);
        for (size_t r = 0; r < kActTileRows && t * kActTileRows + r < a.m; ++r) {
          y[(t * kActTileRows + r) * n_total + n] = round_bf16(out[r]);
        }
      }
    }
  }
}

void GemmFp8Rows(const ActivationLayout& a, const Fp8Weight& w, float* y, size_t n_begin, size_t n_end) {
  if (a.values_t != nullptr && a.m >= kActTileMinRows) {
    BlockGemmTiles<false>(a, w.codes, w.scales, w.n, w.k, y, n_begin, n_end);
  } else {
    BlockGemmRows<false>(a, w.codes, w.scales, w.n, w.k, y, n_begin, n_end);
  }
}
void GemmFp4Rows(const ActivationLayout& a, const Fp4Weight& w, float* y, size_t n_begin, size_t n_end) {
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
      const float v = static_cast<float>(DotBf16WeightsF64(x + i * w.k, wrow, w.k));
      y[i * w.n + n] = out == LinearOut::kBf16 ? round_bf16(v) : v;
    }
  }
}

void LinearF32Rows(const float* x, size_t m, const F32Weight& w, float* y, size_t n_begin, size_t n_end) {
  for (size_t n = n_begin; n < n_end; ++n) {
    const float* wrow = w.data + n * w.k;
    for (size_t i = 0; i < m; ++i) y[i * w.n + n] = DotCanonical(x + i * w.k, wrow, w.k);
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

void gemm_fp8(const PreparedActivations& act, const Fp8Weight& w, float* y, ThreadPool* pool) {
  const ActivationLayout& a = ActivationAccess::layout(act);
  CEDAR_CHECK(a.k == w.k && w.k % 32 == 0, "gemm_fp8: activation k %zu vs weight k %zu (multiple of 32)", a.k,
              w.k);
  for_rows(pool, w.n, [&](size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(GemmFp8Rows)(a, w, y, b, e); });
}

void gemm_fp4(const PreparedActivations& act, const Fp4Weight& w, float* y, ThreadPool* pool) {
  const ActivationLayout& a = ActivationAccess::layout(act);
  CEDAR_CHECK(a.k == w.k && w.k % 32 == 0, "gemm_fp4: activation k %zu vs weight k %zu (multiple of 32)", a.k,
              w.k);
  for_rows(pool, w.n, [&](size_t b, size_t e) { HWY_DYNAMIC_DISPATCH(GemmFp4Rows)(a, w, y, b, e); });
}

void gemm_fp4_rows(const PreparedActivations& a, const Fp4Weight& w, float* y, size_t n_begin, size_t n_end) {
  HWY_DYNAMIC_DISPATCH(GemmFp4Rows)(ActivationAccess::layout(a), w, y, n_begin, n_end);
}

void gemm_fp8_rows(const PreparedActivations& act, const Fp8Weight& w, float* y, size_t n_begin, size_t n_end) {
  const ActivationLayout& a = ActivationAccess::layout(act);
  CEDAR_CHECK(a.k == w.k && w.k % 32 == 0, "gemm_fp8_rows: activation k %zu vs weight k %zu (multiple of 32)", a.k,
              w.k);
  HWY_DYNAMIC_DISPATCH(GemmFp8Rows)(a, w, y, n_begin, n_end);
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

void linear_fp8_bf16_rows(const float* x, size_t m, const Fp8Weight& w, float* y, LinearOut out, size_t n_begin,
                          size_t n_end) {
  // Up to 16 rows at a time are dequantised into a per-thread buffer and run through the exact bf16
  // rows kernel (a row's result depends only on that row), then the outputs are placed.
  constexpr size_t kRows = 16;
  thread_local std::vector<uint16_t> rows;
  thread_local std::vector<float> part;
  if (rows.size() < kRows * w.k) rows.resize(kRows * w.k);
  if (part.size() < m * kRows) part.resize(m * kRows);
  for (size_t n0 = n_begin; n0 < n_end; n0 += kRows) {
    const size_t cnt = std::min(kRows, n_end - n0);
    dequantize_fp8_rows_to_bf16(w, n0, n0 + cnt, rows.data());
    HWY_DYNAMIC_DISPATCH(LinearBf16Rows)(x, m, Bf16Weight{rows.data(), cnt, w.k}, part.data(), out, 0, cnt);
    for (size_t i = 0; i < m; ++i)
      for (size_t j = 0; j < cnt; ++j) y[i * w.n + n0 + j] = part[i * cnt + j];
  }
}

void linear_fp8_bf16(const float* x, size_t m, const Fp8Weight& w, float* y, LinearOut out, ThreadPool* pool) {
  for_rows(pool, w.n, [&](size_t b, size_t e) { linear_fp8_bf16_rows(x, m, w, y, out, b, e); });
}

}  // namespace cedar::ops
#endif  // HWY_ONCE
