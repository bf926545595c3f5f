#include "ops/kernel_set.h"

#include "ops/linear_fast.h"

namespace cedar::ops {

const char* numerics_name(Numerics n) { return n == Numerics::kExact ? "exact" : "fast"; }

std::optional<Numerics> parse_numerics(std::string_view s) {
  if (s == "exact") return Numerics::kExact;
  if (s == "fast") return Numerics::kFast;
  return std::nullopt;
}

const KernelSet& kernel_set(Numerics n) {
  static const KernelSet exact{Numerics::kExact,   fp8_act_scratch_floats, quantize_activations,
                               gemm_fp8,           gemm_fp4,               linear_fp8,
                               linear_fp4,         linear_bf16,            linear_f32};
  static const KernelSet fast{Numerics::kFast,         fast::act_scratch_floats, fast::quantize_activations,
                              fast::gemm_fp8,          fast::gemm_fp4,           fast::linear_fp8,
                              fast::linear_fp4,        fast::linear_bf16,        fast::linear_f32};
  return n == Numerics::kExact ? exact : fast;
}

}  // namespace cedar::ops
