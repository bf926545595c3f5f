// The FP8 GEMV for x86 CPUs with AVX512-VBMI and AVX512-BF16 (Ice Lake server and later, Zen 4 and
// later), used by the fast kernels' AVX-512 targets when the CPU has both extensions.
//
// Why a kernel outside Highway: Highway 1.0.3 (Debian 12) has no target with AVX512-BF16 and no
// two-table byte lookup, and `vdpbf16ps` is what makes FP8 fast here: it multiplies bf16 pairs and adds
// both products to an fp32 lane. A product of an E4M3 weight and a bf16 activation has at most 4 + 8
// significant bits, exact in fp32, so the only rounding is fp32 accumulation, as in the other fast
// kernels. The weights are decoded in registers, 64 codes at a time, one of two ways:
//   * arithmetically (almost every chunk of a trained weight): E4M3's sign, exponent and mantissa
//     bits, moved into place by a 16-bit arithmetic shift and a mask, are the bf16 bits of the value
//     times 2^-120 (the two formats' exponent biases differ by 120), met by activations scaled by
//     2^120. Only zero and the normal codes come out right that way (and the NaN codes as ±480, as in
//     the Highway decoders); `vdpbf16ps` shares its execution ports with byte permutes, so this form runs at
//     ~1.2x the table form (git show f6bfcca:docs/PERFORMANCE_LOG.md).
//   * through two `vpermi2b` lookups in 128-byte tables (the high and low bytes of the bf16 bits),
//     exact for every code: a chunk holding a subnormal code takes this form, with the unscaled
//     activations.
// The instruction treats subnormal inputs as zero and flushes subnormal results, so the kernel only
// takes a 32-row group whose scaled activations are all bf16 values and, where nonzero, of magnitude in
// [2^-117, 256): every product with a nonzero E4M3 weight (>= 2^-9) is then a normal fp32 number, and
// times 2^120 each is a bf16 number. A group that does not qualify (and every group, when an
// activation is not finite) is declined and left to the caller's kernel.
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
