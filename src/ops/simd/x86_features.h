// The run-time checks for the x86 kernels written outside Highway with target attributes
// (x86_fp4_gemv, x86_fp8_gemv, x86_gemm_bf16, x86_indexer_tiles): Highway 1.0's dispatch has no
// target for AVX512-VNNI, -VBMI or -BF16 unless built with HWY_WANT_AVX3_DL (and then not BF16), so
// those kernels are entered only after these checks. Each asks libgcc, which also asks the OS (XCR0)
// whether it saves the AVX-512 state. All false on other architectures.
#pragma once

namespace cedar::ops::x86 {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CEDAR_X86_CPU_SUPPORTS(feature) __builtin_cpu_supports(feature)
#define CEDAR_X86_CPU_IS(vendor) __builtin_cpu_is(vendor)
#else
#define CEDAR_X86_CPU_SUPPORTS(feature) false
#define CEDAR_X86_CPU_IS(vendor) false
#endif

// AVX512-F/BW/VL and AVX512-VNNI: Ice Lake server and later, Zen 4 and later.
inline bool has_avx512_vnni() {
  static const bool has = CEDAR_X86_CPU_SUPPORTS("avx512f") && CEDAR_X86_CPU_SUPPORTS("avx512bw") &&
                          CEDAR_X86_CPU_SUPPORTS("avx512vl") && CEDAR_X86_CPU_SUPPORTS("avx512vnni");
  return has;
}

// AVX512-F/BW and AVX512-BF16: Cooper Lake, Sapphire Rapids and later, Zen 4 and later.
inline bool has_avx512_bf16() {
  static const bool has = CEDAR_X86_CPU_SUPPORTS("avx512f") && CEDAR_X86_CPU_SUPPORTS("avx512bw") &&
                          CEDAR_X86_CPU_SUPPORTS("avx512bf16");
  return has;
}

// AVX512-BF16 and AVX512-VBMI (Sapphire Rapids and later, Zen 4 and later).
inline bool has_avx512_bf16_vbmi() {
  static const bool has = has_avx512_bf16() && CEDAR_X86_CPU_SUPPORTS("avx512vbmi");
  return has;
}

// AVX512-BF16 where a zmm `vdpbf16ps` (32 products) issues as often as an fp32 FMA (16): AMD's Zen 4
// and later. Intel's cores with AVX512-BF16 (Sapphire Rapids to Granite Rapids) issue it once per two
// cycles against two FMAs per cycle, a quarter of the FMA's products per cycle (measured on a Xeon
// with AMX: git show f6bfcca:docs/PERFORMANCE_LOG.md), so there the kernels that have an integer form prefer it.
inline bool has_fast_avx512_bf16_dot() {
  static const bool fast = has_avx512_bf16() && CEDAR_X86_CPU_IS("amd");
  return fast;
}

#undef CEDAR_X86_CPU_SUPPORTS
#undef CEDAR_X86_CPU_IS

}  // namespace cedar::ops::x86
