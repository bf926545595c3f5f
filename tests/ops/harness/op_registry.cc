// The registry's shared machinery: the x86 forms, the target loop, guarded outputs, the default check
// and the correctness runner. The cases themselves are in op_cases_*.cc.
#include "op_registry.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "hwy/targets.h"
#include "ops/formats/formats.h"
#include "ops/linear/x86_fp4_gemv.h"
#include "ops/linear/x86_fp8_gemv.h"
#include "ops/linear/x86_gemm_amx.h"
#include "ops/linear/x86_gemm_bf16.h"
#include "ops/attention/x86_indexer_tiles.h"
#include "ops/simd/simd_info.h"
#include "ops/simd/x86_features.h"
#include "ops_test_util.h"

namespace cedar::ops::testing {
namespace {

bool is_avx3(const std::string& target) { return target.rfind("AVX3", 0) == 0; }
// The targets on which linear_fast takes the FP4 GEMV of x86_fp4_gemv.h.
bool fp4_x86(const std::string& target) { return is_avx3(target) || target == "AVX2"; }

void nothing() {}

// The forms of simd_targets.h's for_each_kernel before this registry, one entry each: every FP4 GEMV
// form with the ones it takes precedence over turned off, the bf16 form also forced where the CPU
// prefers the VNNI one (Intel's), so that every form runs wherever it can.
const KernelForm kForms[] = {
    {"default", ~0u, [](const std::string&) { return true; }, nothing, nothing},
    {"no-fp8-gemv-bf16", kReachFp8Gemv, [](const std::string& t) { return x86::fp8_gemv_bf16_usable() && is_avx3(t); },
     [] { x86::set_fp8_gemv_bf16_allowed(false); }, [] { x86::set_fp8_gemv_bf16_allowed(true); }},
    {"fp4-gemv-bf16-forced", kReachFp4Gemv,
     [](const std::string& t) { return x86::has_avx512_bf16() && !x86::has_fast_avx512_bf16_dot() && fp4_x86(t); },
     [] { x86::set_fp4_gemv_bf16_forced(true); }, [] { x86::set_fp4_gemv_bf16_forced(false); }},
    {"no-fp4-gemv-bf16", kReachFp4Gemv, [](const std::string& t) { return x86::has_avx512_bf16() && fp4_x86(t); },
     [] { x86::set_fp4_gemv_bf16_allowed(false); }, [] { x86::set_fp4_gemv_bf16_allowed(true); }},
    {"no-fp4-gemv-bf16-vnni", kReachFp4Gemv,
     [](const std::string& t) { return x86::fp4_gemv_vnni_usable() && fp4_x86(t); },
     [] {
       x86::set_fp4_gemv_bf16_allowed(false);
       x86::set_fp4_gemv_vnni_allowed(false);
     },
     [] {
       x86::set_fp4_gemv_vnni_allowed(true);
       x86::set_fp4_gemv_bf16_allowed(true);
     }},
    {"no-amx", kReachGemmTiles, [](const std::string&) { return x86::gemm_amx_usable(); },
     [] { x86::set_gemm_amx_allowed(false); }, [] { x86::set_gemm_amx_allowed(true); }},
    {"no-amx-no-bf16-tiles", kReachGemmTiles, [](const std::string&) { return x86::gemm_bf16_usable(); },
     [] {
       x86::set_gemm_amx_allowed(false);
       x86::set_gemm_bf16_allowed(false);
     },
     [] {
       x86::set_gemm_bf16_allowed(true);
       x86::set_gemm_amx_allowed(true);
     }},
    {"no-indexer-tiles-vnni", kReachIndexTiles, [](const std::string&) { return x86::indexer_tiles_vnni_usable(); },
     [] { x86::set_indexer_tiles_vnni_allowed(false); }, [] { x86::set_indexer_tiles_vnni_allowed(true); }},
};

constexpr uint32_t kPoison = 0x7FC0DEADu;  // a quiet NaN no kernel computes
constexpr uint32_t kGuardWord = 0x7FBADBADu;

}  // namespace

std::span<const KernelForm> kernel_forms() { return kForms; }

void for_each_form(uint32_t reach, const std::function<void(const KernelForm&)>& fn) {
  const std::string target = dispatched_simd_target();
  for (const KernelForm& form : kForms) {
    if (&form != &kForms[0] && ((form.reach & reach) == 0 || !form.applies(target))) continue;
    form.enter();
    fn(form);
    form.leave();
  }
}

void for_each_target(const std::function<void(const std::string&)>& fn, const std::string& only) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    const std::string name = hwy::TargetName(target);
    if (!only.empty() && name.find(only) == std::string::npos) continue;
    hwy::SetSupportedTargetsForTest(target);
    fn(dispatched_simd_target());
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the real CPU
}

GuardedFloats::GuardedFloats(size_t n) : n_(n), buf_(n + 2 * kGuard, from_bits(kGuardWord)) { poison(); }

void GuardedFloats::poison() {
  for (size_t i = 0; i < n_; ++i) data()[i] = from_bits(kPoison);
}

bool GuardedFloats::guards_intact() const {
  for (size_t i = 0; i < kGuard; ++i)
    if (bits_of(buf_[i]) != kGuardWord || bits_of(buf_[kGuard + n_ + i]) != kGuardWord) return false;
  return true;
}

std::string PreparedCase::check(Numerics mode) const {
  std::ostringstream err;
  if (mode == Numerics::kExact || fast_bound.empty()) {
    for (size_t i = 0; i < want.size(); ++i)
      if (bits_of(out.data()[i]) != bits_of(want[i])) {
        err << "@" << i << " got " << out.data()[i] << " want " << want[i] << " (bitwise)";
        return err.str();
      }
    return "";
  }
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double got = out.data()[i], diff = std::fabs(got - want[i]);
    const double bound = fast_bound[i] + fast_rel * (std::fabs(got) + std::fabs(want[i]));
    if (!(diff <= bound)) {
      err << "@" << i << " got " << got << " want " << want[i] << " bound " << bound;
      return err.str();
    }
    err2 += diff * diff;
    ref2 += static_cast<double>(want[i]) * want[i];
  }
  if (ref2 > 0 && !(err2 / ref2 < 1e-4)) {
    err << "normalised mean squared error " << err2 / ref2 << " >= 1e-4";
    return err.str();
  }
  return "";
}

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> all;
    add_linear_cases(all);
    add_attention_cases(all);
    add_elementwise_cases(all);
    return all;
  }();
  return cases;
}

bool matches(const OpCase& c, const std::string& filter) {
  std::istringstream words(filter);
  std::string w;
  while (words >> w)
    if (c.name.find(w) == std::string::npos) return false;
  return true;
}

std::vector<std::string> check_case(const OpCase& c, ThreadPool* pool, const std::string& only_target) {
  std::vector<std::string> failures;
  const auto prepared = c.prepare(PrepareOptions{});
  PreparedCase& p = *prepared;
  std::vector<float> inline_out(p.out.size());
  for_each_target(
      [&](const std::string& target) {
        for (Numerics mode : c.numerics) {
          const KernelSet& ks = kernel_set(mode);
          // The linear forms switch fast kernels; the exact set reaches only the indexer's tiles.
          const uint32_t reach = mode == Numerics::kFast ? c.reach : c.reach & kReachIndexTiles;
          for_each_form(reach, [&](const KernelForm& form) {
            p.out.poison();
            p.run(ks, nullptr);
            std::string err = p.out.guards_intact() ? p.check(mode) : "wrote outside its output";
            std::memcpy(inline_out.data(), p.out.data(), inline_out.size() * 4);
            if (err.empty() && pool != nullptr) {
              p.out.poison();
              p.run(ks, pool);
              if (!p.out.guards_intact()) {
                err = "wrote outside its output on the pool";
              } else if (std::memcmp(inline_out.data(), p.out.data(), inline_out.size() * 4) != 0) {
                err = "the thread count changed the output";
              }
            }
            if (!err.empty())
              failures.push_back(c.name + " | " + target + " | " + numerics_name(mode) + " | " + form.name + ": " +
                                 err);
          });
        }
      },
      only_target);
  return failures;
}

}  // namespace cedar::ops::testing
