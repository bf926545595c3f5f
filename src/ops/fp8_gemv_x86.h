// The FP8 GEMV for x86 CPUs with AVX512-VBMI and AVX512-BF16 (Ice Lake server and later, Zen 4 and
// later), used by the fast kernels' AVX-512 targets when the CPU has both extensions.
//
// Why a kernel outside Highway: Highway 1.0.3 (Debian 12) has no target with AVX512-BF16 and no
// two-table byte lookup, and those two instructions are what make FP8 fast here:
//   * decode: every E4M3 value is exactly a bf16 value (4 significant bits, exponent 2^-9..2^8), so
//     two `vpermi2b` lookups in 128-byte tables give the high and low bytes of the bf16 bits of 64
//     codes at once (subnormal codes included: they are normal bf16 numbers), the sign is ORed in;
//   * dot product: `vdpbf16ps` multiplies bf16 pairs and adds both products to an fp32 lane. A
//     product of an E4M3 weight and a bf16 activation has at most 4 + 8 significant bits, exact in
//     fp32, so the only rounding is fp32 accumulation, as in the other fast kernels.
// The instruction treats subnormal inputs as zero and flushes subnormal results, so the kernel only
// takes activations that are bf16 values (after the power-of-two weight scale) of magnitude zero or
// at least 2^-117 (then every product with a nonzero E4M3 weight, >= 2^-9, is a normal fp32 number);
// a 32-row group whose activations do not qualify is declined and left to the caller's kernel.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops::x86 {

// Whether this CPU has AVX512-F/BW, AVX512-VBMI and AVX512-BF16 and tests have not turned the kernel off.
bool fp8_gemv_bf16_usable();
// Tests: false makes callers take their Highway kernel on a CPU with the extensions too, so both run.
void set_fp8_gemv_bf16_allowed(bool allowed);

// y[r * n_total + n] = bf16( Σ_k act[r, k] · w[n, k] ) for rows r < m (1..4) and weight rows n from
// n_begin towards n_end: act [m, k] fp32, codes [n_total, k] E4M3, scales [ceil(n_total/32), k/32]
// E8M0, k a multiple of 32. Returns where it stopped: n_end, or the first row of a 32-row group whose
// scaled activations it declines (see above); the caller computes that group and calls again after it.
// Only callable when fp8_gemv_bf16_usable().
size_t fp8_gemv_bf16(const float* act, size_t m, const uint8_t* codes, const uint8_t* scales, size_t n_total,
                     size_t k, float* y, size_t n_begin, size_t n_end);

}  // namespace cedar::ops::x86
