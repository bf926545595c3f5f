#include "ops/kernel_set.h"

#include <algorithm>

#include "core/thread_pool.h"
#include "ops/linear_fast.h"

namespace cedar::ops {

const char* numerics_name(Numerics n) { return n == Numerics::kExact ? "exact" : "fast"; }

std::optional<Numerics> parse_numerics(std::string_view s) {
  if (s == "exact") return Numerics::kExact;
  if (s == "fast") return Numerics::kFast;
  return std::nullopt;
}

const KernelSet& kernel_set(Numerics n) {
  static const KernelSet exact{.numerics = Numerics::kExact,
                               .act_scratch_floats = fp8_act_scratch_floats,
                               .quantize_activations = quantize_activations,
                               .quantize_activations_fp8 = quantize_activations,
                               .gemm_fp8 = gemm_fp8,
                               .gemm_fp4 = gemm_fp4,
                               .gemm_fp4_rows = gemm_fp4_rows,
                               .gemm_fp8_rows = gemm_fp8_rows,
                               .linear_fp8 = linear_fp8,
                               .linear_fp4 = linear_fp4,
                               .linear_bf16 = linear_bf16,
                               .linear_f32 = linear_f32,
                               .linear_fp8_bf16 = linear_fp8_bf16,
                               .linear_fp8_bf16_rows = linear_fp8_bf16_rows};
  static const KernelSet fast{.numerics = Numerics::kFast,
                              .act_scratch_floats = fast::act_scratch_floats,
                              .quantize_activations = fast::quantize_activations,
                              .quantize_activations_fp8 = fast::quantize_activations_fp8,
                              .gemm_fp8 = fast::gemm_fp8,
                              .gemm_fp4 = fast::gemm_fp4,
                              .gemm_fp4_rows = fast::gemm_fp4_rows,
                              .gemm_fp8_rows = fast::gemm_fp8_rows,
                              .linear_fp8 = fast::linear_fp8,
                              .linear_fp4 = fast::linear_fp4,
                              .linear_bf16 = fast::linear_bf16,
                              .linear_f32 = fast::linear_f32,
                              .linear_fp8_bf16 = fast::linear_fp8_bf16,
                              .linear_fp8_bf16_rows = fast::linear_fp8_bf16_rows};
  return n == Numerics::kExact ? exact : fast;
}

void gemm_fp4_batch(const KernelSet& ks, std::span<const Fp4GemmJob> jobs, ThreadPool* pool) {
  constexpr size_t kUnit = 16;  // rows per work unit (one fast GEMM panel)
  size_t units = 0;
  for (const Fp4GemmJob& j : jobs) units += (j.w.n + kUnit - 1) / kUnit;
  const auto run_units = [&](size_t u0, size_t u1) {
    size_t base = 0;  // first unit of the current job
    for (const Fp4GemmJob& j : jobs) {
      const size_t ju = (j.w.n + kUnit - 1) / kUnit;
      const size_t b = std::max(u0, base), e = std::min(u1, base + ju);
      if (b < e) ks.gemm_fp4_rows(j.a, j.w, j.y, (b - base) * kUnit, std::min(j.w.n, (e - base) * kUnit));
      base += ju;
    }
  };
  if (pool == nullptr || pool->size() <= 1) {
    run_units(0, units);
    return;
  }
  pool->parallel_for(units, 1, [&](size_t u0, size_t u1, int) { run_units(u0, u1); });
}

void fp8_linear_batch(const KernelSet& ks, std::span<const Fp8LinearJob> jobs, ThreadPool* pool) {
  constexpr size_t kUnit = 32;  // rows per work unit: one row of FP8 weight scales
  size_t units = 0;
  for (const Fp8LinearJob& j : jobs) units += (j.w.n + kUnit - 1) / kUnit;
  const auto run_units = [&](size_t u0, size_t u1) {
    size_t base = 0;  // first unit of the current job
    for (const Fp8LinearJob& j : jobs) {
      const size_t ju = (j.w.n + kUnit - 1) / kUnit;
      const size_t b = std::max(u0, base), e = std::min(u1, base + ju);
      if (b < e) {
        const size_t n0 = (b - base) * kUnit, n1 = std::min(j.w.n, (e - base) * kUnit);
        if (j.kind == Fp8LinearJob::Kind::kGemm) {
          ks.gemm_fp8_rows(j.a, j.w, j.y, n0, n1);
        } else {
          ks.linear_fp8_bf16_rows(j.a.values, j.a.m, j.w, j.y, LinearOut::kBf16, n0, n1);
        }
      }
      base += ju;
    }
  };
  if (pool == nullptr || pool->size() <= 1) {
    run_units(0, units);
    return;
  }
  pool->parallel_for(units, 1, [&](size_t u0, size_t u1, int) { run_units(u0, u1); });
}

}  // namespace cedar::ops
