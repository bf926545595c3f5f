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
// holds it exactly in any order (block_dot32_exact, ops/linear/linear_internal.h): the fast paths and the
// scalar references agree bit for bit by construction, whatever their summation order.
//
// The GEMV (m = 1..3) and the multi-row tiled kernel (m >= kActTileMinRows, using the row-interleaved
// copies the quantiser prepares) both compute exactly this; both equal the references bit for bit.
//
// bf16 / f32 weights: y = f32( Σ_k x·w ), the exact products summed in float64 in the canonical 32-lane
// order of dot_canonical.h and rounded once (then to bf16 for LinearOut::kBf16); fast path and
// reference are bit-identical on every target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ops/linear/activation_layout.h"

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
  // The same weight in 12 bits per weight (ops/linear/bf16_coded.h), when the model coded it for the fast
  // kernels' GEMV; the exact kernels and the fast GEMM read `bits`.
  const Bf16Coded* coded = nullptr;
};

// f32 weight [n, k].
struct F32Weight {
  const float* data = nullptr;  // [n, k]
  size_t n = 0;
  size_t k = 0;
};

// Activations prepared for the FP8/FP4 linears: an opaque handle. The model gets one only from the
// kernel set's quantisers (KernelSet::quantize_activations*, one quantisation feeding several GEMMs,
// e.g. w1 and w3 of every selected expert) or, for the linears that take x unquantised (wo_a, the
// kAsBf16 jobs of fp8_linear_batch), from unquantized(); it passes the handle back into kernel-set
// calls and may ask its shape. What is inside (codes as floats, scales, the row-interleaved,
// integer-plane, bf16-pair and AMX copies some kernels read) depends on the kernel set and the CPU;
// only ops code reads it (ops/linear/activation_access.h). A handle views the scratch it was built in.
class PreparedActivations {
 public:
  PreparedActivations() = default;
  // x [m, k] as given (bf16 values held as floats), not quantised.
  static PreparedActivations unquantized(const float* x, size_t m, size_t k) {
    PreparedActivations a;
    a.layout_.values = x;
    a.layout_.m = m;
    a.layout_.k = k;
    return a;
  }
  size_t m() const { return layout_.m; }
  size_t k() const { return layout_.k; }
  // Whether this is x as given (unquantized()) rather than a quantiser's output.
  bool is_unquantized() const { return layout_.scales == nullptr; }

 private:
  friend class ActivationAccess;
  ActivationLayout layout_;
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
PreparedActivations quantize_activations(const float* x, size_t m, size_t k, std::span<float> scratch);

// y [m, n] (bf16 values) = x [m, k] · Wᵀ with FP8 block-scaled weights. scratch as above.
void linear_fp8(const float* x, size_t m, const Fp8Weight& w, float* y, std::span<float> scratch,
                ThreadPool* pool);
// y [m, n] (bf16 values) = x [m, k] · Wᵀ with packed FP4 weights (activations FP8, block 32).
void linear_fp4(const float* x, size_t m, const Fp4Weight& w, float* y, std::span<float> scratch,
                ThreadPool* pool);
// The same two GEMMs on pre-quantised activations (a.k must equal w.k).
void gemm_fp8(const PreparedActivations& a, const Fp8Weight& w, float* y, ThreadPool* pool);
void gemm_fp4(const PreparedActivations& a, const Fp4Weight& w, float* y, ThreadPool* pool);

// One GEMM of a batch (gemm_fp4_batch): y = a · wᵀ.
struct Fp4GemmJob {
  PreparedActivations a;
  Fp4Weight w;
  float* y = nullptr;
};
// Rows [n_begin, n_end) of gemm_fp4 on the calling thread (the unit the batch splits).
void gemm_fp4_rows(const PreparedActivations& a, const Fp4Weight& w, float* y, size_t n_begin, size_t n_end);
// Rows [n_begin, n_end) of gemm_fp8 on the calling thread (the unit fp8_linear_batch splits).
void gemm_fp8_rows(const PreparedActivations& a, const Fp8Weight& w, float* y, size_t n_begin, size_t n_end);

// One FP8 linear of a batch (fp8_linear_batch, kernel_set.h):
//   kGemm:   y = a · wᵀ, a from quantize_activations (gemm_fp8);
//   kAsBf16: y = linear_fp8_bf16(x, a.m(), w) with bf16 output; a is PreparedActivations::unquantized(x, ...).
struct Fp8LinearJob {
  enum class Kind { kGemm, kAsBf16 };
  Kind kind = Kind::kGemm;
  PreparedActivations a;
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
void gemm_fp8(const PreparedActivations& a, const Fp8Weight& w, float* y);
void gemm_fp4(const PreparedActivations& a, const Fp4Weight& w, float* y);
void linear_bf16(const float* x, size_t m, const Bf16Weight& w, float* y, LinearOut out);
void linear_f32(const float* x, size_t m, const F32Weight& w, float* y);
}  // namespace ref

}  // namespace cedar::ops
