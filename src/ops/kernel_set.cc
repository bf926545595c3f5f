#include "ops/kernel_set.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "ops/linear/activation_access.h"
#include "ops/block/hc.h"
#include "ops/linear/linear_fast.h"
#include "ops/block/moe.h"

namespace cedar::ops {

const char* numerics_name(Numerics n) { return n == Numerics::kExact ? "exact" : "fast"; }

std::optional<Numerics> parse_numerics(std::string_view s) {
  if (s == "exact") return Numerics::kExact;
  if (s == "fast") return Numerics::kFast;
  return std::nullopt;
}

namespace {
std::unique_ptr<Bf16Coded> code_for_fast_gemv(Bf16Weight* w) {
  if (w->coded != nullptr || !bf16_codable(w->k)) return nullptr;
  std::unique_ptr<Bf16Coded> coded = code_bf16(*w);
  if (coded == nullptr) {
    CEDAR_LOG_WARN("could not allocate %.2f GiB to re-code a [%zu, %zu] bf16 weight; its GEMV reads bf16",
                   static_cast<double>(bf16_coded_base_bytes(w->n, w->k)) / (1 << 30), w->n, w->k);
    return nullptr;
  }
  w->coded = coded.get();
  return coded;
}
}  // namespace

const KernelSet& kernel_set(Numerics n) {
  static const KernelSet exact{.numerics = Numerics::kExact,
                               .act_scratch_floats = fp8_act_scratch_floats,
                               .quantize_activations = quantize_activations,
                               .quantize_activations_fp8 = quantize_activations,
                               .gemm_fp4_rows = gemm_fp4_rows,
                               .gemm_fp8_rows = gemm_fp8_rows,
                               .linear_fp8 = linear_fp8,
                               .linear_fp4 = linear_fp4,
                               .linear_bf16 = linear_bf16,
                               .linear_fp8_bf16_rows =
                                   [](const PreparedActivations& a, const Fp8Weight& w, float* y, LinearOut out,
                                      size_t b, size_t e) {
                                     linear_fp8_bf16_rows(ActivationAccess::layout(a).values, a.m(), w, y, out, b, e);
                                   },
                               .pair_unquantized = nullptr,
                               .prepare_gemv_weight = [](Bf16Weight*) { return std::unique_ptr<Bf16Coded>(); },
                               .swiglu_clamped = swiglu_clamped,
                               .hc_mixes = hc_mixes,
                               .sparse_attn = sparse_attn};
  static const KernelSet fast{.numerics = Numerics::kFast,
                              .act_scratch_floats = fast::act_scratch_floats,
                              .quantize_activations = fast::quantize_activations,
                              .quantize_activations_fp8 = fast::quantize_activations_fp8,
                              .gemm_fp4_rows = fast::gemm_fp4_rows,
                              .gemm_fp8_rows = fast::gemm_fp8_rows,
                              .linear_fp8 = fast::linear_fp8,
                              .linear_fp4 = fast::linear_fp4,
                              .linear_bf16 = fast::linear_bf16,
                              .linear_fp8_bf16_rows = fast::linear_fp8_bf16_rows,
                              .pair_unquantized = fast::pair_unquantized,
                              .prepare_gemv_weight = code_for_fast_gemv,
                              .swiglu_clamped = fast::swiglu_clamped,
                              .hc_mixes = fast::hc_mixes,
                              .sparse_attn = fast::sparse_attn};
  return n == Numerics::kExact ? exact : fast;
}

namespace {
// Runs rows(job, n_begin, n_end) over every job's output rows in ONE parallel region: rows in units
// of `unit`, the units of all jobs split evenly over the pool (a row's value never depends on the split).
template <typename Job, typename Rows>
void run_jobs_in_one_region(std::span<const Job> jobs, size_t unit, ThreadPool* pool, const Rows& rows) {
  size_t units = 0;
  for (const Job& j : jobs) units += (j.w.n + unit - 1) / unit;
  const auto run_units = [&](size_t u0, size_t u1) {
    size_t base = 0;  // first unit of the current job
    for (const Job& j : jobs) {
      const size_t ju = (j.w.n + unit - 1) / unit;
      const size_t b = std::max(u0, base), e = std::min(u1, base + ju);
      if (b < e) rows(j, (b - base) * unit, std::min(j.w.n, (e - base) * unit));
      base += ju;
    }
  };
  if (pool == nullptr || pool->size() <= 1) {
    run_units(0, units);
    return;
  }
  pool->parallel_for(units, 1, [&](size_t u0, size_t u1, int) { run_units(u0, u1); });
}
}  // namespace

void gemm_fp4_batch(const KernelSet& ks, std::span<const Fp4GemmJob> jobs, ThreadPool* pool) {
  // 16 rows per unit: one fast GEMM panel.
  run_jobs_in_one_region(jobs, 16, pool, [&](const Fp4GemmJob& j, size_t n0, size_t n1) {
    ks.gemm_fp4_rows(j.a, j.w, j.y, n0, n1);
  });
}

void fp8_linear_batch(const KernelSet& ks, std::span<const Fp8LinearJob> jobs, ThreadPool* pool) {
  // The unquantised inputs of GEMM-sized kAsBf16 jobs (wo_a in prefill) are packed as bf16 pairs for
  // the fast GEMM's AVX512-BF16 tile once here, before the region. The caller's buffers, grown to
  // the largest batch once and then reused.
  thread_local std::vector<Fp8LinearJob> paired;
  thread_local std::vector<uint32_t> pairs;
  for (const Fp8LinearJob& j : jobs)
    CEDAR_CHECK(j.a.is_unquantized() == (j.kind == Fp8LinearJob::Kind::kAsBf16),
                "fp8_linear_batch: a kAsBf16 job takes PreparedActivations::unquantized(x, ...), a kGemm job a "
                "kernel-set quantiser's output");
  if (ks.pair_unquantized != nullptr) {
    size_t words = 0;
    for (const Fp8LinearJob& j : jobs)
      if (j.kind == Fp8LinearJob::Kind::kAsBf16) words += j.a.m() * j.a.k() / 2;
    if (pairs.size() < words) pairs.resize(words);
    paired.assign(jobs.begin(), jobs.end());
    size_t used = 0;
    for (Fp8LinearJob& j : paired) {
      if (j.kind == Fp8LinearJob::Kind::kAsBf16 && ks.pair_unquantized(&j.a, pairs.data() + used))
        used += j.a.m() * j.a.k() / 2;
    }
    jobs = paired;
  }
  // 32 rows per unit: one row of FP8 weight scales.
  run_jobs_in_one_region(jobs, 32, pool, [&](const Fp8LinearJob& j, size_t n0, size_t n1) {
    if (j.kind == Fp8LinearJob::Kind::kGemm) {
      ks.gemm_fp8_rows(j.a, j.w, j.y, n0, n1);
    } else {
      ks.linear_fp8_bf16_rows(j.a, j.w, j.y, LinearOut::kBf16, n0, n1);
    }
  });
}

}  // namespace cedar::ops
