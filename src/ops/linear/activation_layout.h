// The inside of a PreparedActivations handle (ops/linear/linear.h): what the quantisers write and the linear
// kernels read. Ops-internal: the model never names these fields (the handle keeps them private;
// ops code reads them through ActivationAccess, ops/linear/activation_access.h). The handle holds this
// struct by value, so its definition is here rather than in a .cc.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops {

// The act_quant codes of FP4 GEMV rows as int16, so the kernel multiplies on integers (vpmaddwd).
// Each block's codes are exact integers v = q · 2^9 (|v| <= 448 · 2^9 < 2^18). The block stores
// v >> shift, with the smallest shift (0..3) that fits int16, in `plane`, and 2^(shift-18) · s in
// `factor` (2^-9 undoes the integer scaling, 2^-9 the kernel's 256·2·E2M1 weight values). When some
// v is not a multiple of 2^shift (an element more than ~2^11 below the block's largest; rare in real
// activations) the block is also listed in `residual_block` with v & (2^shift - 1) in
// `residual_plane`, whose products the kernel adds with factor 2^-18 · s: the sum stays exact.
// Element order inside a block: even elements 0-7, odd 0-7, even 8-15, odd 8-15 (element j is the
// (j % 2) nibble of packed byte j / 2; the kernel decodes low nibbles into one 128-bit lane and high
// nibbles into the other).
// On CPUs with AVX512-VNNI the planes are packed as bytes for that kernel instead (ops/linear/x86_fp4_gemv.h):
// `plane` is then nullptr and `vnni_plane` / `vnni_correction` are set; factor and the residuals are
// the same in both forms.
struct Fp4GemvPlanes {
  const int16_t* plane = nullptr;           // [m, k/32, 32]
  const float* factor = nullptr;            // [m, k/32]
  const uint32_t* residual_count = nullptr; // [m]
  const uint32_t* residual_block = nullptr; // [m, k/32], the first residual_count[r] used
  const int16_t* residual_plane = nullptr;  // [m, k/32, 32], likewise
  const int8_t* vnni_plane = nullptr;       // [m, padded k/32, 64]
  const int32_t* vnni_correction = nullptr; // [m, padded k/32]
  // On CPUs with AVX512-BF16: the values as bf16 in x86_fp4_gemv.h's layout, [m, fp4_bf16_plane_words(k)];
  // when present the other planes are absent.
  const uint16_t* bf16_plane = nullptr;
};

// Where element j of a block goes in its int16 plane: even elements 0-7, odd 0-7, even 8-15, odd 8-15
// (element j is the (j % 2) nibble of byte j / 2).
constexpr size_t fp4_plane_slot(size_t j) { return (j / 16) * 16 + (j % 2) * 8 + (j / 2) % 8; }

// The activations themselves. The E4M3 codes are kept decoded (exactly) as f32 so the kernels decode
// only the weights.
struct ActivationLayout {
  const float* values = nullptr;  // [m, k] E4M3 code values as f32 (q, not q·s)
  const float* scales = nullptr;  // [m, k/32] the power-of-two block scales s
  size_t m = 0;
  size_t k = 0;
  // Optional row-interleaved copies for the multi-row (prefill) kernels, filled by
  // quantize_activations when m >= kActTileMinRows: rows grouped in tiles of kActTileRows (the last
  // tile zero-padded), values_t [tiles, k, 16] and scales_t [tiles, k/32, 16]. nullptr = not present
  // (the kernels then use the row-by-row path; results are identical either way).
  const float* values_t = nullptr;
  const float* scales_t = nullptr;
  // Set by fast::quantize_activations: `values` hold the dequantised activations q·s (exact in f32)
  // and `scales` still hold s. Only the fast kernels (ops/linear/linear_fast.h) accept this form.
  bool dequantized = false;
  // Also from fast::quantize_activations, for rows that take the FP4 GEMV (m < 6); plane == nullptr:
  // absent.
  Fp4GemvPlanes fp4_planes = {};
  // Also from fast::quantize_activations, for GEMM-sized m on CPUs with AVX512-BF16
  // (ops/linear/x86_gemm_bf16.h): the values as bf16 pairs [m, k/2] (element 2p in the low half), present
  // only when every value is zero or a normal bf16 number; bf16_exp_lo / hi: the smallest and largest
  // f32 exponent field among the nonzero values. nullptr = absent (the fp32 tile runs).
  const uint32_t* bf16_pairs = nullptr;
  int bf16_exp_lo = 0, bf16_exp_hi = 0;
  // Also from fast::quantize_activations, with bf16_pairs, for 6..64 rows on CPUs with AMX-BF16: the
  // pairs as the AMX tiles' right-hand operand (ops/linear/x86_gemm_amx.h, fp4_rows_amx), 16 rows per tile
  // (the last zero-padded): per 32-K step j and tile t, 256 u32 at (j * tiles + t) * 256, pair p of
  // row 16t + r at p * 16 + r. nullptr = absent.
  const uint32_t* amx_pairs = nullptr;
};

}  // namespace cedar::ops
