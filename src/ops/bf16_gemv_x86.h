// The bf16 GEMV for x86 CPUs with AVX512-BF16 (Cooper Lake, Sapphire Rapids and later, Zen 4 and
// later), taken by the fast kernels' AVX-512 targets for GEMV-sized rows of bf16 weights (the output
// head, the router gate, the compressor and indexer projections).
//
// Why a kernel outside Highway: Highway 1.0.3 (Debian 12) has no target with AVX512-BF16. The
// Highway kernel (linear_fast.cc, Bf16GemvTile) turns each weight pair into two fp32 lanes and
// multiplies them by fp32 activations split into even and odd halves: for k = 5120 that is 40 KiB of
// activations per weight row, more than L1, so every 64 bytes of weights cost 128 bytes of L2 reads,
// and with 2 threads it read 29 GB/s of a machine's 34 (Zen 4). Here the activations are bf16 (10 KiB
// for k = 5120, they stay in L1) and `vdpbf16ps` multiplies 32 weight pairs by them and adds both
// products of each pair to an fp32 lane: one instruction per 64 bytes of weights.
//
// Numerics: the activations of a bf16 linear are bf16 values (linear.h's input convention); the
// kernel checks it and declines a call whose activations are not, so a product of two bf16 values is
// exact in fp32 as in the other fast kernels, and the only rounding is the fp32 accumulation.
// `vdpbf16ps` treats subnormal inputs as zero and flushes subnormal results: a product or partial
// sum below 2^-126 in magnitude may be lost, an absolute error of at most (2k + Σ|x|)·2^-126 on top of
// the accumulation bound (NUMERICS §10).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops::x86 {

// Whether this CPU has AVX512-F/BW and AVX512-BF16 and tests have not turned the kernel off.
bool bf16_gemv_dot_usable();
// Tests: false makes callers take their Highway kernel on a CPU with the extension too, so both run.
void set_bf16_gemv_dot_allowed(bool allowed);

// y[r * n_total + n] = Σ_k x[r, k] · w[n, k] (bf16_out: rounded to bf16) for rows r < m (1..4) and
// weight rows [n_begin, n_end): x [m, k] fp32, w [n_total, k] bf16 bits. Returns false, writing
// nothing, when an activation is not a bf16 value; the caller then computes the call itself. Only
// callable when bf16_gemv_dot_usable().
bool bf16_gemv_dot(const float* x, size_t m, size_t k, const uint16_t* w, size_t n_total, float* y, bool bf16_out,
                   size_t n_begin, size_t n_end);

}  // namespace cedar::ops::x86
