// The sum of a zmm's 16 fp32 lanes, for the AVX-512 kernels written outside Highway (fp8_gemv_x86.cc),
// in a fixed tree: lanes i and i + 8, then i and i + 4, i and i + 2, i and i + 1.
// Through memory rather than shuffles: GCC 12's shuffle and cast intrinsics start from an undefined
// vector and trip -Wmaybe-uninitialized, and this runs once per output, not per weight.
// Include only after <immintrin.h>, in x86-64 builds.
#pragma once

namespace cedar::ops::x86 {

__attribute__((target("avx512f"), always_inline)) inline float sum_lanes_avx512(__m512 v) {
  alignas(64) float lane[16];
  _mm512_store_ps(lane, v);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) lane[i] += lane[i + w];
  return lane[0];
}

}  // namespace cedar::ops::x86
