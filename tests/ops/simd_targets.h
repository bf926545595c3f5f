// Test helpers: run a body once per Highway target that is both compiled in and supported by this CPU,
// with dispatch forced to that target (for_each_simd_target), and per target once per x86 kernel form
// the body can reach (for_each_kernel: the fast linears' FP8/FP4 GEMVs and GEMM tiles;
// for_each_tile_kernel: the indexer's key tiles). The forms are the op registry's table
// (harness/op_registry.cc, kernel_forms), so the tests and the registry run the same variants.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "harness/op_registry.h"
#include "hwy/targets.h"
#include "ops/simd/simd_info.h"

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

// fn on every SIMD target, once per x86 form reaching `reach` that applies there ("default" first).
template <typename Fn>
void for_each_form_on_every_target(uint32_t reach, Fn&& fn) {
  for_each_simd_target([&] {
    for_each_form(reach, [&](const KernelForm& form) {
      SCOPED_TRACE(std::string("x86 form ") + form.name);
      fn();
    });
  });
}

// Every SIMD target, and per target the fast linears' x86 forms: with and without the AVX512-BF16
// FP8 GEMV of x86_fp8_gemv.h; the FP4 GEMV of x86_fp4_gemv.h in its bf16 form (forced where the CPU
// would take the VNNI one), its VNNI form and neither (the Highway kernel); with and without the AMX
// tiles of x86_gemm_amx.h and the AVX512-BF16 GEMM tile of x86_gemm_bf16.h; as far as the CPU has them.
template <typename Fn>
void for_each_kernel(Fn&& fn) {
  for_each_form_on_every_target(kReachLinear, fn);
}

// Every SIMD target, and again without the AVX512-VNNI index-key tile kernel where the CPU has it
// (that kernel runs under any dispatched target, in place of the target's own tile sums).
template <typename Fn>
void for_each_tile_kernel(Fn&& fn) {
  for_each_form_on_every_target(kReachIndexTiles, fn);
}

}  // namespace cedar::ops::testing
