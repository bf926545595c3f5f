// The kernel set a model runs with, chosen once when it loads (`--numerics exact|fast`), so the forward
// pass calls one set of ops and never branches on the mode.
//
//   exact: the numerics contract (docs/NUMERICS.md §1): exact sums rounded once; bit-identical to the
//          golden reference. The speed of float64 accumulation.
//   fast:  the same model semantics (FP8 activations with E8M0 scales, exact weight decoding) with fp32
//          summation in registers (ops/linear/linear_fast.h); bounded difference from exact, tested per op.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "ops/attention/attention.h"
#include "ops/linear/bf16_coded.h"
#include "ops/linear/linear.h"

namespace cedar::ops {

enum class Numerics { kExact, kFast };

const char* numerics_name(Numerics n);
// "exact" or "fast"; nullopt otherwise.
std::optional<Numerics> parse_numerics(std::string_view s);

// Only what the model calls: the other linears of linear.h / linear_fast.h (linear_f32,
// linear_fp8_bf16, whole gemm_fp8 / gemm_fp4) are reached through the batches below or not at all,
// and the op tests call them by name.
struct KernelSet {
  Numerics numerics;
  // Activation quantisation for the FP8/FP4 GEMMs: scratch floats, then the quantiser.
  size_t (*act_scratch_floats)(size_t m, size_t k);
  PreparedActivations (*quantize_activations)(const float* x, size_t m, size_t k, std::span<float> scratch);
  // The same for FP8 GEMMs only (fast mode skips the FP4 GEMV's integer planes).
  PreparedActivations (*quantize_activations_fp8)(const float* x, size_t m, size_t k, std::span<float> scratch);
  // Rows [n_begin, n_end) of gemm_fp4 / gemm_fp8 (linear.h) on the calling thread: the units
  // gemm_fp4_batch and fp8_linear_batch split.
  void (*gemm_fp4_rows)(const PreparedActivations& a, const Fp4Weight& w, float* y, size_t n_begin, size_t n_end);
  void (*gemm_fp8_rows)(const PreparedActivations& a, const Fp8Weight& w, float* y, size_t n_begin, size_t n_end);
  void (*linear_fp8)(const float* x, size_t m, const Fp8Weight& w, float* y, std::span<float> scratch,
                     ThreadPool* pool);
  // The DSpark draft's routed experts (model/dspark.cc), one expert's rows at a time.
  void (*linear_fp4)(const float* x, size_t m, const Fp4Weight& w, float* y, std::span<float> scratch,
                     ThreadPool* pool);
  void (*linear_bf16)(const float* x, size_t m, const Bf16Weight& w, float* y, LinearOut out, ThreadPool* pool);
  // Rows [n_begin, n_end) of linear_fp8_bf16(x, a.m(), w): a is PreparedActivations::unquantized(x, ...),
  // and in fast mode optionally x as bf16 pairs (pair_unquantized) for the AVX512-BF16 GEMM tile.
  void (*linear_fp8_bf16_rows)(const PreparedActivations& a, const Fp8Weight& w, float* y, LinearOut out,
                               size_t n_begin, size_t n_end);
  // Fast mode on CPUs with AVX512-BF16: packs the x of an unquantized() handle (a->m() >= 6 rows of
  // a->k()) into `pairs` (a->m() * a->k() / 2 words) and points a at them when every value is a bf16
  // number the tile takes; false (a unchanged) otherwise. nullptr in exact mode.
  bool (*pair_unquantized)(PreparedActivations* a, uint32_t* pairs);
  // Readies a bf16 weight that a GEMV streams every token (the head) for this set, once at load. The
  // fast set re-codes it in 12 bits per weight (bf16_coded.h; its GEMV then reads a quarter fewer
  // bytes, results unchanged), points w->coded at the copy and returns the copy for the caller to
  // keep. nullptr and w unchanged otherwise: the exact set, a width the form cannot hold, a weight
  // already coded, or memory that cannot be had (logged; the GEMV then reads the bits).
  std::unique_ptr<Bf16Coded> (*prepare_gemv_weight)(Bf16Weight* w);
  // The experts' clamped SwiGLU (moe.h): silu in double (exact) or in f32 vectors (fast).
  void (*swiglu_clamped)(const float* g, const float* u, size_t n, float limit, float weight, float* out);
  // The mHC mixes (hc.h): the contract's float64 dots (exact) or fp32 register tiles (fast).
  void (*hc_mixes)(const float* x, size_t n_tokens, size_t hc_dim, const float* fn, size_t n_mix, float norm_eps,
                   float* mixes, ThreadPool* pool);
  // Sparse attention (attention.h): the contract's float64 sums (exact) or fp32 ones (fast).
  void (*sparse_attn)(const float* q, size_t n_heads, size_t head_dim, const KvRows& kv, const float* sink,
                      const int32_t* idx, size_t n_idx, float scale, float* out, ThreadPool* pool);
};

// The process-wide kernel set of a mode (static storage).
const KernelSet& kernel_set(Numerics n);

// Several FP4 GEMMs in ONE parallel region (e.g. w1 and w3 of every expert a decode step selected):
// their output rows, in blocks of 16, are split evenly over the pool. Each output equals what
// gemm_fp4 (exact) or fast::gemm_fp4 computes for its job (a row's value never depends on how rows
// are split).
void gemm_fp4_batch(const KernelSet& ks, std::span<const Fp4GemmJob> jobs, ThreadPool* pool);
// Several independent FP8 linears in ONE parallel region (e.g. wq_a and wkv of the same input, the
// shared expert's w1 and w3, the groups of wo_a): output rows in blocks of 32 (one FP8 scale row)
// split over the pool. Each output equals what the job's own call (gemm_fp8, linear_fp8_bf16, in the
// kernel set's mode) gives.
void fp8_linear_batch(const KernelSet& ks, std::span<const Fp8LinearJob> jobs, ThreadPool* pool);

}  // namespace cedar::ops
