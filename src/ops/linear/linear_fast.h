// The fast linear kernels (`--numerics fast`, the default): the same model semantics as linear.h —
// activations quantised to FP8 E4M3 with E8M0 block scales (act_quant), FP4/FP8/bf16 weights decoded
// exactly — with only the summation order relaxed: products are summed in fp32 registers (FMA) in the
// order that suits the hardware instead of the contract's "exact, then rounded once".
//
//   quantize_activations:  a[m, k] = e4m3(x / s) · s   (the act_quant values, dequantised: exact in f32)
//   gemm_fp8 / gemm_fp4:    y[m, n] = bf16( Σ_k a[m,k] · w[n,k] )    w decoded exactly incl. its scale
//   linear_bf16 / _f32:     y[m, n] = Σ_k x[m,k] · w[n,k]  in fp32, rounded per LinearOut
//
// Every product a·w is exact in fp32 (at most 4 + 4 significant bits for FP8, 4 + 2 for FP4; bf16 x
// bf16 has 16), so the only error against the exact kernels is fp32 summation: with d additions on a
// product's path to the result, |fast - exact| <= (d_fast + d_exact) · 2^-24 · Σ|a·w| before the final
// rounding (docs/NUMERICS.md "Fast numerics"; tests/ops/linear_fast_test.cc checks the bound on every
// compiled SIMD target). Each output is computed by one thread in a fixed order, so results do not
// depend on the thread count; they may depend on m (rows 1..kFastGemmMinRows-1 take the GEMV kernel,
// more rows the tiled GEMM kernel).
//
// Weights are never copied or converted outside registers and small per-thread panels; kernels do
// not allocate after a thread's first call with the largest shape.
#pragma once

#include <cstddef>
#include <span>

#include "ops/linear/linear.h"

namespace cedar::ops::fast {

// Rows from which the tiled GEMM kernel is used (fewer rows: the GEMV kernel, weights decoded once
// per block for all rows).
inline constexpr size_t kFastGemmMinRows = 6;

size_t act_scratch_floats(size_t m, size_t k);
PreparedActivations quantize_activations(const float* x, size_t m, size_t k, std::span<float> scratch);
void gemm_fp8(const PreparedActivations& a, const Fp8Weight& w, float* y, ThreadPool* pool);
void gemm_fp4(const PreparedActivations& a, const Fp4Weight& w, float* y, ThreadPool* pool);
void gemm_fp4_rows(const PreparedActivations& a, const Fp4Weight& w, float* y, size_t n_begin, size_t n_end);
void gemm_fp8_rows(const PreparedActivations& a, const Fp8Weight& w, float* y, size_t n_begin, size_t n_end);
// Activations for the FP8 GEMMs only: quantize_activations without the FP4 GEMV's integer planes.
PreparedActivations quantize_activations_fp8(const float* x, size_t m, size_t k, std::span<float> scratch);
void linear_fp8(const float* x, size_t m, const Fp8Weight& w, float* y, std::span<float> scratch,
                ThreadPool* pool);
void linear_fp8_bf16(const float* x, size_t m, const Fp8Weight& w, float* y, LinearOut out, ThreadPool* pool);
// Rows [n_begin, n_end) of linear_fp8_bf16 with x given as PreparedActivations::unquantized(x, ...),
// carrying x as bf16 pairs when pair_unquantized packed them.
void linear_fp8_bf16_rows(const PreparedActivations& a, const Fp8Weight& w, float* y, LinearOut out, size_t n_begin,
                          size_t n_end);
// Where the CPU has AVX512-BF16 and a is GEMM-sized (a->m() >= kFastGemmMinRows, a->k() % 32 == 0): packs
// its x into pairs (a->m() * a->k() / 2 words) and, when every value is zero or a normal bf16 number,
// points a at them with their exponent range. Returns whether it did.
bool pair_unquantized(PreparedActivations* a, uint32_t* pairs);
void linear_fp4(const float* x, size_t m, const Fp4Weight& w, float* y, std::span<float> scratch,
                ThreadPool* pool);
void linear_bf16(const float* x, size_t m, const Bf16Weight& w, float* y, LinearOut out, ThreadPool* pool);
void linear_f32(const float* x, size_t m, const F32Weight& w, float* y, ThreadPool* pool);

}  // namespace cedar::ops::fast
