// Test helpers: run a body once per Highway target that is both compiled in and supported by this CPU,
// with dispatch forced to that target (for_each_simd_target), and per target once per x86 kernel
// variant of the fast linears (for_each_kernel).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "hwy/targets.h"
#include "ops/fp4_gemv_x86.h"
#include "ops/fp8_gemv_x86.h"
#include "ops/gemm_amx_x86.h"
#include "ops/gemm_bf16_x86.h"
#include "ops/simd_info.h"
#include "ops/x86_features.h"

namespace cedar::ops::testing {

template <typename Fn>
void for_each_simd_target(Fn&& fn) {
  const auto targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(target));
    ASSERT_EQ(dispatched_simd_target(), hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the real CPU
}

// Every SIMD target, and on a CPU with AVX512-VBMI and AVX512-BF16 the AVX-512 targets twice: with the
// FP8 GEMV of fp8_gemv_x86.h and without it (their Highway kernel), so both are tested. Likewise the
// AVX2 and AVX-512 targets run the FP4 GEMV of fp4_gemv_x86.h in its bf16 form (AVX512-BF16), its
// VNNI form (AVX512-VNNI) and neither (the Highway kernel), as far as the CPU has them (the bf16 form
// forced where the CPU would take the VNNI one), and on a CPU
// with AVX512-BF16 every target runs with and without the GEMM tile of gemm_bf16_x86.h (and on one
// with AMX-BF16 with the AMX tiles of gemm_amx_x86.h, without them, and without both).
template <typename Fn>
void for_each_kernel(Fn&& fn) {
  for_each_simd_target([&] {
    fn();
    if (x86::fp8_gemv_bf16_usable() && dispatched_simd_target().rfind("AVX3", 0) == 0) {
      SCOPED_TRACE("without the AVX512-BF16 FP8 GEMV");
      x86::set_fp8_gemv_bf16_allowed(false);
      fn();
      x86::set_fp8_gemv_bf16_allowed(true);
    }
    const std::string target = dispatched_simd_target();
    const bool fp4_x86 = target.rfind("AVX3", 0) == 0 || target == "AVX2";
    // The FP4 GEMV forms, each with the ones it takes precedence over turned off; the bf16 form also
    // forced where the CPU prefers the VNNI one (Intel's), so that every form runs wherever it can.
    if (x86::has_avx512_bf16() && !x86::has_fast_avx512_bf16_dot() && fp4_x86) {
      SCOPED_TRACE("with the AVX512-BF16 FP4 GEMV forced");
      x86::set_fp4_gemv_bf16_forced(true);
      fn();
      x86::set_fp4_gemv_bf16_forced(false);
    }
    x86::set_fp4_gemv_bf16_allowed(false);
    if (x86::has_avx512_bf16() && fp4_x86) {
      SCOPED_TRACE("without the AVX512-BF16 FP4 GEMV");
      fn();
    }
    if (x86::fp4_gemv_vnni_usable() && fp4_x86) {
      SCOPED_TRACE("without the AVX512-BF16 and AVX512-VNNI FP4 GEMVs");
      x86::set_fp4_gemv_vnni_allowed(false);
      fn();
      x86::set_fp4_gemv_vnni_allowed(true);
    }
    x86::set_fp4_gemv_bf16_allowed(true);
    if (x86::gemm_amx_usable()) {
      SCOPED_TRACE("without the AMX GEMM tiles");
      x86::set_gemm_amx_allowed(false);
      fn();
      x86::set_gemm_amx_allowed(true);
    }
    if (x86::gemm_bf16_usable()) {
      SCOPED_TRACE("without the AMX and AVX512-BF16 GEMM tiles");
      x86::set_gemm_amx_allowed(false);
      x86::set_gemm_bf16_allowed(false);
      fn();
      x86::set_gemm_bf16_allowed(true);
      x86::set_gemm_amx_allowed(true);
    }
  });
}

}  // namespace cedar::ops::testing
