// Per-target (Highway) pieces shared by the fast linear kernels of linear_fast.cc (block-scaled FP8 /
// FP4 weights) and linear_fast_dense.cc (bf16 / f32 weights): the GEMV row count and weight prefetch,
// the bf16 pairs of the AVX512-BF16 and AMX tiles, and the tiled GEMM over decoded panels. Include
// inside a file compiled through foreach_target.h, after "hwy/highway.h".
#if defined(CEDAR_OPS_LINEAR_FAST_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef CEDAR_OPS_LINEAR_FAST_INL_H_
#undef CEDAR_OPS_LINEAR_FAST_INL_H_
#else
#define CEDAR_OPS_LINEAR_FAST_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "hwy/highway.h"
#include "ops/linear/x86_gemm_amx.h"
#include "ops/linear/x86_gemm_bf16.h"
#include "ops/simd/prefetch.h"
#include "ops/linear/weight_decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace cedar::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr size_t kGemvRows = 4;  // activation rows sharing one decoded weight block
// The GEMVs prefetch their weights ahead of the lines being read (ops/simd/prefetch.h), once per 64-byte
// line. The weights are contiguous across rows, so the addresses run on into the next rows.
HWY_INLINE void PrefetchLine(const void* line) { prefetch_weight_stream(line); }

// ---- bf16 pairs for the AVX512-BF16 tile (ops/linear/x86_gemm_bf16.h) ----------------------------------

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
// inline: linear_fast.cc and linear_fast_dense.cc each define and export it (one definition per target).
inline HWY_NOINLINE bool ToBf16Pairs(const float* v, size_t n_pairs, uint32_t* pairs, int* lo, int* hi) {
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
// act_pairs (may be nullptr): the activations as bf16 pairs (ActivationLayout::bf16_pairs, exponent
// fields act_lo..act_hi); a panel whose weights are bf16 values too, with products that can neither
// flush to zero nor overflow, then runs on the AMX tiles (x86_gemm_amx.h) or the AVX512-BF16 tile.
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

}  // namespace HWY_NAMESPACE
}  // namespace cedar::ops
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
