// The prefill GEMM's register tile on AVX512-BF16 (`vdpbf16ps`): two products per fp32 lane and
// instruction where the fp32 tile (PanelTile in linear_fast-inl.h) does one FMA. Used only when both
// operands are exactly bf16 values, so every product is the exact product the fp32 tile forms; only
// the order of the fp32 additions differs (fast numerics, NUMERICS.md §9).
//
// The instruction treats subnormal inputs and results as zero. PanelGemm takes this tile only when
// every activation and weight value of the panel is zero or a normal bf16 number and the smallest
// nonzero magnitudes multiply to at least 2^-126, so no product is flushed; a partial sum that
// cancels into the subnormal range is flushed, an absolute error below 2^-126 per addition.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops::x86 {

// Whether this CPU has AVX512-F/BW and AVX512-BF16 and tests have not turned the tile off.
bool gemm_bf16_usable();
// Tests: false keeps PanelGemm on its fp32 tile.
void set_gemm_bf16_allowed(bool allowed);

// acc[r * 16 + c] (first: =, else +=) Σ_{p < pairs} Σ_{j < 2} act(r, 2p + j) · panel(2p + j, c), for
// rows r < mr (1..6). act_pairs: per row, `pairs` u32 holding the bf16 bits of elements 2p (low
// half) and 2p + 1 (high half), rows `lda_pairs` apart. panel_pairs: [pairs][16 columns] u32 in the
// same form. acc: [mr, 16] fp32. Only callable when
// gemm_bf16_usable().
void panel_tile_bf16(size_t mr, const uint32_t* act_pairs, size_t lda_pairs, const uint32_t* panel_pairs,
                     size_t pairs, float* acc, bool first);

// A prefill panel of FP4 weights straight from the packed bytes: rows r < nr (1..16) of the weight,
// row r at packed + r * row_bytes with its E8M0 scales at scales + r * scale_stride, blocks
// [0, n_blocks) of each (32 columns each), written as panel[(16 * b + i) * 16 + r] = the bf16 pair of
// codes 2i (low half) and 2i + 1 (high half) of row r's block b, each E2M1 value times its block's
// scale (exactly a bf16 number; a packed byte is one pair); rows nr..15 are zero. The rows are
// decoded into registers and transposed 16 x 16 there. The exponent fields of the nonzero values lie
// in [s - 1, s + 2] for scale byte s (E2M1's 0.5..6), so lo / hi widen to min(s) - 1 and max(s) + 2.
// Returns false (panel incomplete) when a scale is outside [2, 252], where a value could be
// subnormal, infinite or NaN: the caller decodes that panel the general way. Only callable when
// gemm_bf16_usable().
bool fp4_panel_bf16_pairs(const uint8_t* packed, size_t row_bytes, const uint8_t* scales, size_t scale_stride,
                          size_t nr, size_t n_blocks, uint32_t* panel, int* lo, int* hi);

// The same for FP8 weights (E4M3 codes [rows, k], one E8M0 scale per 32 x 32 block), on CPUs that
// also have AVX512-VBMI (else it returns false): rows r < nr (1..16) at codes + r * row_bytes, all in
// one 32-row scale group whose scales for these blocks are scales[0..n_blocks); panel[(16 * b + i) *
// 16 + r] = the bf16 pair of codes 2i and 2i + 1 of row r's block b times the block's scale. Every
// E4M3 value times a power of two is a bf16 number; the exponent fields lie in [s - 9, s + 8] (2^-9
// .. 448), so lo / hi widen to min(s) - 9 and max(s) + 8, and scales outside [10, 246] or a NaN code
// (0x7F, 0xFF) return false. Only callable when gemm_bf16_usable().
bool fp8_panel_bf16_pairs(const uint8_t* codes, size_t row_bytes, const uint8_t* scales, size_t nr, size_t n_blocks,
                          uint32_t* panel, int* lo, int* hi);

}  // namespace cedar::ops::x86
