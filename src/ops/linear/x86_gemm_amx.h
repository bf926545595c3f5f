// The prefill GEMM on AMX-BF16 tiles (Sapphire Rapids and later): `tdpbf16ps` multiplies a 16-row x
// 32-K bf16 tile by a 32-K x 16-column one into 16 x 16 fp32 accumulators, 8,192 products per
// instruction where `vdpbf16ps` forms 32. Two forms: the bf16 panels of the GEMM (activations left,
// weight panels right: panel_tiles_amx) and, for few activation rows, the weights on the left in
// their own row order (fp4_rows_amx), where transposing them into panels would cost most of the time.
//
// The panels and their checks are the AVX512-BF16 tile's (x86_gemm_bf16.h): operands that are exactly
// bf16 values, zero or normal, whose nonzero products lie in fp32's normal range. Like `vdpbf16ps`,
// the instruction treats subnormal inputs and results as zero and rounds to nearest even, so each
// product is the exact product and only the order of the fp32 additions differs from the other tiles
// (fast numerics, NUMERICS.md §9).
//
// Linux hands a process the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM);
// gemm_amx_usable() asks once. The tile configuration is a thread's register state: a thread loads it
// with AmxTiles before its first tile and releases it afterwards (AmxTiles does both).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops::x86 {

// Whether this CPU has AMX-TILE and AMX-BF16 (and AVX512-BF16, which the panels need), the kernel
// granted this process the tile state, and tests have not turned the tiles off.
bool gemm_amx_usable();
// Tests: false keeps PanelGemm on its AVX-512 tiles.
void set_gemm_amx_allowed(bool allowed);

// The thread's tile configuration for panel_tiles_amx, loaded on construction and released
// (`tilerelease`, so that the thread's state no longer holds 8 KB of tile data) on destruction. Only
// constructible when gemm_amx_usable().
class AmxTiles {
 public:
  AmxTiles();
  ~AmxTiles();
  AmxTiles(const AmxTiles&) = delete;
  AmxTiles& operator=(const AmxTiles&) = delete;
};

// For each panel j < n_panels (1..4), and rows r < m16 (a multiple of 16):
//   acc[j][r * 16 + c] (first: =, else +=) Σ_{p < pairs} Σ_{i < 2} act(r, 2p + i) · panel_j(2p + i, c)
// act_pairs: per row, u32 pairs (bf16 bits of elements 2p and 2p + 1, low half first), rows
// `lda_pairs` apart; panels[j]: [pairs][16 columns] u32 in the same form (x86_gemm_bf16.h's panel
// layout, which is the tiles' own). pairs: a multiple of 16. acc[j]: [m16, 16] fp32, 64-byte rows.
// Each 16-row activation tile is loaded once per 16 pairs and multiplied into all the panels. Only
// callable while an AmxTiles lives on this thread.
void panel_tiles_amx(size_t m16, const uint32_t* act_pairs, size_t lda_pairs, const uint32_t* const* panels,
                     size_t n_panels, size_t pairs, float* const* acc, bool first);

// The most activation rows fp4_rows_amx takes (four 16-row tiles share each weight tile).
inline constexpr size_t kAmxSmallGemmRows = 64;

// amx_pairs (ActivationLayout::amx_pairs's layout) from bf16 pairs [m, k/2], m <= kAmxSmallGemmRows.
void amx_pairs_from_rows(const uint32_t* pairs, size_t m, size_t k, uint32_t* amx_pairs);

// A prefill GEMM for few rows (an expert's share of a chunk: ~8 of 512 tokens): weight rows [n0, n0
// + nr) (nr <= 16) of an FP4 matrix (packed [*, k/2], E8M0 scales [*, k/32]) against m <= 64
// activation rows in amx_pairs (exponent fields act_lo..act_hi, as for the bf16 panels):
// y[r * n_total + n] = bf16(Σ_k a[r, k] w[n, k]). Here the weights are the left-hand tiles in their
// own row order, each 32-element block decoded to bf16 with its scale folded into the exponents, so
// nothing is transposed, and one accumulator tile per 16 activation rows holds the whole sum. Returns
// false (nothing written) when a block's scale is outside [2, 252] or a product could leave fp32's
// normal range (the bf16 panels' checks); the caller computes those rows another way. Only callable
// while an AmxTiles (16 columns) lives on this thread.
bool fp4_rows_amx(const uint32_t* amx_pairs, size_t m, int act_lo, int act_hi, const uint8_t* packed,
                  const uint8_t* scales, size_t k, size_t n0, size_t nr, float* y, size_t n_total);

}  // namespace cedar::ops::x86
