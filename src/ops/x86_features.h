// The run-time check for the x86 kernels written outside Highway with target attributes
// (fp4_gemv_x86.cc, indexer_tiles_x86.cc): Highway 1.0's dispatch has no AVX512-VNNI target unless
// built with HWY_WANT_AVX3_DL, so those kernels are entered only after this check.
#pragma once

namespace cedar::ops::x86 {

// AVX512-F/BW/VL and AVX512-VNNI, with the OS saving the AVX-512 state (libgcc's check asks XCR0).
// Ice Lake server and later, Zen 4 and later. False on other architectures.
inline bool has_avx512_vnni() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

}  // namespace cedar::ops::x86
