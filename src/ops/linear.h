// y = x · Wᵀ for the four weight encodings of a V4.1 checkpoint (spec §2.3).
//
// x is [m, k] row-major floats holding bf16 values; W is [n, k] (PyTorch Linear layout) and is read in
// place from its packed, usually mmapped, storage: kernels never copy or convert weights per call and
// never allocate. Work is split over n (output features) on the given pool (nullptr = run inline);
// the result does not depend on the thread count.
//
// FP8 and FP4 (block-scaled) semantics, reference fp8_gemm / fp4_gemm under the numerics contract
// (docs/NUMERICS.md §1, docs/GOLDEN.md §2.2):
//   a, sA  = act_quant_fp8(x)                         codes [m, k] E4M3, scales [m, k/32] 2^e
//   part_kb = f32( Σ_{k in block kb} a[m,k] · w[n,k] )   the EXACT block sum, rounded once to fp32
//   acc    = 0;  for kb in 0..k/32-1 (in order):  acc += (part_kb · sA[m,kb]) · sW(n,kb)   (fp32)
//   y[m,n] = bf16(acc)
// with sW(n,kb) = scale[n/32, kb] for FP8 weights and scale[n, kb] for FP4 weights.
// Every product is exact in fp32 and a block's 32-term sum has at most 41 significant bits, so float64
// holds it exactly in any order (block_dot32_exact, ops/linear_internal.h): the fast paths and the
// scalar references agree bit for bit by construction, whatever their summation order.
//
// The GEMV (m = 1..3) and the multi-row tiled kernel (m >= kActTileMinRows, using the row-interleaved
// copies in Fp8Activations) both compute exactly this; both equal the references bit for bit.
//
// bf16 / f32 weights: y = f32( Σ_k x·w ), the exact products summed in float64 in the canonical 32-lane
// order of dot_canonical.h and rounded once (then to bf16 for LinearOut::kBf16); fast path and
// reference are bit-identical on every target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace cedar {
class ThreadPool;
}

namespace cedar::ops {

// FP8 E4M3 weight [n, k] with one E8M0 scale per 32×32 block: scales [ceil(n/32), ceil(k/32)].
struct Fp8Weight {
  const uint8_t* codes = nullptr;   // [n, k] E4M3
  const uint8_t* scales = nullptr;  // [ceil(n/32), ceil(k/32)] E8M0
  size_t n = 0;
  size_t k = 0;  // must be a multiple of 32 (activation block)
};

// Packed FP4 E2M1 weight [n, k] stored as [n, k/2] bytes (even k in the low nibble) with one E8M0 scale
// per row and 32 columns: scales [n, k/32].
struct Fp4Weight {
  const uint8_t* packed = nullptr;  // [n, k/2]
  const uint8_t* scales = nullptr;  // [n, k/32] E8M0
  size_t n = 0;
  size_t k = 0;  // multiple of 32
};

struct Bf16Coded;

// bf16 weight [n, k] as raw bf16 bits.
struct Bf16Weight {
  const uint16_t* bits = nullptr;  // [n, k]
  size_t n = 0;
  size_t k = 0;
  // The same weight in 12 bits per weight (ops/bf16_coded.h), when the model coded it for the fast
  // kernels' GEMV; the exact kernels and the fast GEMM read `bits`.
  const Bf16Coded* coded = nullptr;
};

// f32 weight [n, k].
struct F32Weight {
  const float* data = nullptr;  // [n, k]
  size_t n = 0;
  size_t k = 0;
};

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
// On CPUs with AVX512-VNNI the planes are packed as bytes for that kernel instead (ops/fp4_gemv_x86.h):
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
  // On CPUs with AVX512-BF16: the values as bf16 in fp4_gemv_x86.h's layout, [m, fp4_bf16_plane_words(k)];
  // when present the other planes are absent.
  const uint16_t* bf16_plane = nullptr;
};

// Where element j of a block goes in its int16 plane: even elements 0-7, odd 0-7, even 8-15, odd 8-15
// (element j is the (j % 2) nibble of byte j / 2).
constexpr size_t fp4_plane_slot(size_t j) { return (j / 16) * 16 + (j % 2) * 8 + (j / 2) % 8; }

// Activations already quantised by act_quant_fp8 (lets one quantisation feed several GEMMs, e.g. the
// w1 and w3 projections of every selected expert). The E4M3 codes are kept decoded (exactly) as f32
// so the kernels decode only the weights.
struct Fp8Activations {
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
  // and `scales` still hold s. Only the fast kernels (ops/linear_fast.h) accept this form.
  bool dequantized = false;
  // Also from fast::quantize_activations, for rows that take the FP4 GEMV (m < 6); plane == nullptr:
  // absent.
  Fp4GemvPlanes fp4_planes = {};
  // Also from fast::quantize_activations, for GEMM-sized m on CPUs with AVX512-BF16
  // (ops/gemm_bf16_x86.h): the values as bf16 pairs [m, k/2] (element 2p in the low half), present
  // only when every value is zero or a normal bf16 number; bf16_exp_lo / hi: the smallest and largest
  // f32 exponent field among the nonzero values. nullptr = absent (the fp32 tile runs).
  const uint32_t* bf16_pairs = nullptr;
  int bf16_exp_lo = 0, bf16_exp_hi = 0;
  // Also from fast::quantize_activations, with bf16_pairs, for 6..64 rows on CPUs with AMX-BF16: the
  // pairs as the AMX tiles' right-hand operand (ops/gemm_amx_x86.h, fp4_rows_amx), 16 rows per tile
  // (the last zero-padded): per 32-K step j and tile t, 256 u32 at (j * tiles + t) * 256, pair p of
  // row 16t + r at p * 16 + r. nullptr = absent.
  const uint32_t* amx_pairs = nullptr;
};

inline constexpr size_t kActTileRows = 16;
inline constexpr size_t kActTileMinRows = 4;

// How a bf16/f32 linear rounds its output.
enum class LinearOut {
  kBf16,  // bf16 matmul (torch F.linear on bf16): exact dot rounded to f32, then to bf16
  kF32,   // f32 matmul (weights promoted to fp32, e.g. head, router gate, ratio-2 compressor)
};

// Floats of scratch linear_fp8 / linear_fp4 need for m rows of width k: m*k values + m*k/32 scales,
// plus the row-interleaved copies when m >= kActTileMinRows.
size_t fp8_act_scratch_floats(size_t m, size_t k);

// Quantises x [m, k] (act_quant, block 32, UE8M0) into `scratch` (>= fp8_act_scratch_floats(m, k))
// and returns a view of it.
Fp8Activations quantize_activations(const float* x, size_t m, size_t k, std::span<float> scratch);

// y [m, n] (bf16 values) = x [m, k] · Wᵀ with FP8 block-scaled weights. scratch as above.
void linear_fp8(const float* x, size_t m, const Fp8Weight& w, float* y, std::span<float> scratch,
                ThreadPool* pool);
// y [m, n] (bf16 values) = x [m, k] · Wᵀ with packed FP4 weights (activations FP8, block 32).
void linear_fp4(const float* x, size_t m, const Fp4Weight& w, float* y, std::span<float> scratch,
                ThreadPool* pool);
// The same two GEMMs on pre-quantised activations (a.k must equal w.k).
void gemm_fp8(const Fp8Activations& a, const Fp8Weight& w, float* y, ThreadPool* pool);
void gemm_fp4(const Fp8Activations& a, const Fp4Weight& w, float* y, ThreadPool* pool);

// One GEMM of a batch (gemm_fp4_batch): y = a · wᵀ.
struct Fp4GemmJob {
  Fp8Activations a;
  Fp4Weight w;
  float* y = nullptr;
};
// Rows [n_begin, n_end) of gemm_fp4 on the calling thread (the unit the batch splits).
void gemm_fp4_rows(const Fp8Activations& a, const Fp4Weight& w, float* y, size_t n_begin, size_t n_end);
// Rows [n_begin, n_end) of gemm_fp8 on the calling thread (the unit fp8_linear_batch splits).
void gemm_fp8_rows(const Fp8Activations& a, const Fp8Weight& w, float* y, size_t n_begin, size_t n_end);

// One FP8 linear of a batch (fp8_linear_batch, kernel_set.h):
//   kGemm:   y = a · wᵀ, a from quantize_activations (gemm_fp8);
//   kAsBf16: y = linear_fp8_bf16(a.values, a.m, w) with bf16 output; a.values is x unquantised.
struct Fp8LinearJob {
  enum class Kind { kGemm, kAsBf16 };
  Kind kind = Kind::kGemm;
  Fp8Activations a;
  Fp8Weight w;
  float* y = nullptr;
};

// y [m, n] = x [m, k] · Wᵀ with bf16 weights; exact dots rounded once; output rounded per `out`.
void linear_bf16(const float* x, size_t m, const Bf16Weight& w, float* y, LinearOut out, ThreadPool* pool);
// y [m, n] = x [m, k] · Wᵀ with f32 weights, f32 output.
void linear_f32(const float* x, size_t m, const F32Weight& w, float* y, ThreadPool* pool);
// linear_bf16 of x with the FP8 weight dequantised to bf16 (convert.py does that for wo_a; every
// E4M3 value times 2^e is a bf16, so the dequantised weight is exact). The weight stays FP8 in memory
// and is decoded a few rows at a time: half the bytes read per token. Activations are not quantised.
// Equals linear_bf16(x, m, dequantize_fp8_weight_to_bf16(w), y, out) bit for bit.
void linear_fp8_bf16(const float* x, size_t m, const Fp8Weight& w, float* y, LinearOut out, ThreadPool* pool);
// Rows [n_begin, n_end) of the same on the calling thread.
void linear_fp8_bf16_rows(const float* x, size_t m, const Fp8Weight& w, float* y, LinearOut out, size_t n_begin,
                          size_t n_end);

// One-time load helper (not for the hot path): dequantises an FP8 block-scaled weight to bf16 bits
// [n, k], exactly (E4M3 value × 2^e is bf16-representable), as convert.py does for wo_a.
void dequantize_fp8_weight_to_bf16(const Fp8Weight& w, uint16_t* out_bits);
// Rows [n_begin, n_end) of the same, into out_bits [n_end - n_begin, k].
void dequantize_fp8_rows_to_bf16(const Fp8Weight& w, size_t n_begin, size_t n_end, uint16_t* out_bits);

// Plain scalar references (the definitions above, no SIMD) that the fast paths are tested against.
namespace ref {
void gemm_fp8(const Fp8Activations& a, const Fp8Weight& w, float* y);
void gemm_fp4(const Fp8Activations& a, const Fp4Weight& w, float* y);
void linear_bf16(const float* x, size_t m, const Bf16Weight& w, float* y, LinearOut out);
void linear_f32(const float* x, size_t m, const F32Weight& w, float* y);
}  // namespace ref

}  // namespace cedar::ops
