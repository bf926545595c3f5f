// The sum of a zmm's 16 fp32 lanes, for the AVX-512 kernels written outside Highway (x86_fp8_gemv.cc),
// in a fixed tree: lanes i and i + 8, then i and i + 4, i and i + 2, i and i + 1.
// In registers, through the masked shuffle forms with a full mask: the plain forms (and
// _mm512_reduce_add_ps) start from an undefined vector in GCC 12's headers and trip
// -Wmaybe-uninitialized. A round trip through memory instead
// costs a store-forwarding stall per output: 10 % of an FP8 GEMV with k = 5120, 18 % with k = 1280.
// Include only after <immintrin.h>, in x86-64 builds.
#pragma once

namespace cedar::ops::x86 {

__attribute__((target("avx512f"), always_inline)) inline float sum_lanes_avx512(__m512 v) {
  constexpr __mmask16 kAll = 0xFFFF;
  v = _mm512_add_ps(v, _mm512_mask_shuffle_f32x4(v, kAll, v, v, 0x4E));  // + lane i + 8 (256-bit halves swapped)
  v = _mm512_add_ps(v, _mm512_mask_shuffle_f32x4(v, kAll, v, v, 0xB1));  // + lane i + 4 (128-bit quarters swapped)
  v = _mm512_add_ps(v, _mm512_mask_permute_ps(v, kAll, v, 0x4E));        // + lane i + 2
  v = _mm512_add_ps(v, _mm512_mask_permute_ps(v, kAll, v, 0xB1));        // + lane i + 1
  return _mm512_cvtss_f32(v);
}

}  // namespace cedar::ops::x86
