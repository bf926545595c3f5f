// The fast linears over dense weights of linear_fast.h (bf16 bits, f32): Highway kernels compiled for
// every enabled target and chosen at run time, in the two shapes of linear_fast.cc (the GEMV for
// m < kFastGemmMinRows, else the tiled GEMM over decoded panels of linear_fast-inl.h).
#include "ops/linear/linear_fast.h"

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/thread_pool.h"
#include "ops/linear/bf16_coded.h"
#include "ops/formats/formats.h"
#include "ops/linear/x86_gemm_bf16.h"
#include "ops/linear/linear_internal.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/linear/linear_fast_dense.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "ops/linear/linear_fast-inl.h"
#include "ops/linear/weight_decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

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

HWY_EXPORT(FastLinearBf16);
HWY_EXPORT(FastLinearF32);
HWY_EXPORT(ToBf16Pairs);

namespace fast {

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

}  // namespace fast
}  // namespace cedar::ops
#endif  // HWY_ONCE
