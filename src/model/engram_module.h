// Engram module arithmetic (spec §4.3 "Module"; reference model.py ParallelEngramEmbedding.forward
// and Engram.forward), without any weight I/O: the caller owns the table view and runs `wkv`.
//
//   E      = bf16( f32(e4m3 code) * f32(e8m0 scale of its 32-column block) )     dequant_engram_rows
//   kv     = wkv(E)                                   (FP8 linear, done by the caller, bf16 values)
//   key_j  = kv[j*dim : (j+1)*dim]  (j < hc),  value = kv[hc*dim : (hc+1)*dim]
//   then per token and stream j, all f32, in the reference's operation order:
//   w      = f32(q_weight_j) * f32(k_weight_j)                                    (rounded f32)
//   rstd   = rsqrt(Σh²/dim + eps) * rsqrt(Σkey²/dim + eps)         (two statistics, then one product)
//   dot    = ((Σ_d (h_d * w_d) * key_d) * rstd) * f32(dim^-0.5)    (rstd multiplies AFTER the sum)
//   gate   = sigmoid(copysign(sqrt(max(|dot|, f32(1e-6))), dot)),  0 for image tokens
//   h_out  = bf16(h + gate * value)
// Numerics contract (docs/NUMERICS.md §1): the products are fp32 as above, the sums over d are float64
// rounded once (ops::dot_rounded_products_f64, ops::rms_rsqrt), the rsqrt and the sigmoid are
// evaluated in double and rounded once (ops/simd/exact_math.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"

namespace cedar::model {

// Looks up and dequantises Engram table rows: table_codes [table_rows, head_dim] E4M3 bytes,
// table_scales [table_rows, head_dim/32] E8M0 bytes, row_ids [n] (global rows), out [n, head_dim]
// bf16-valued floats. Row ids outside the table are an error naming the id (a config/checkpoint
// mismatch); nothing is written then.
// Runs on `pool` (the forward pass's: Engram shares the engine's threads).
Status dequant_engram_rows(std::span<const uint8_t> table_codes, std::span<const uint8_t> table_scales,
                           int64_t table_rows, int head_dim, std::span<const int64_t> row_ids, std::span<float> out,
                           ThreadPool& pool);

struct EngramGateShape {
  int64_t n_tokens = 0;
  int hc = 0;    // residual streams (hc_mult)
  int dim = 0;   // model width
};

// What engram_gate_update works in, kept by its caller between calls: grown on first use, never
// allocated again for the same shape and thread count (no allocation in the decode loop).
struct EngramGateScratch {
  std::vector<float> weight;    // [hc, dim] q_weight * k_weight
  std::vector<float> products;  // [threads, dim] h * weight, one row per pool thread
};

// Updates the residual streams in place with the gated Engram value, on `pool`.
//   x        [n_tokens, hc, dim]     bf16-valued floats, in/out
//   kv       [n_tokens, (hc+1)*dim]  bf16-valued floats: wkv(E)
//   q_weight, k_weight [hc, dim]     bf16 bits (checkpoint layout)
//   eps      norm_eps as f32 (1e-20 for V4.1)
//   takes_part  empty (all text) or [n_tokens], 0 = image token (gate 0: x passes through)
//   gates_out   empty or [n_tokens, hc]: the gates, for diagnostics and tests
// Shapes must match (a mismatch is a wiring bug: CEDAR_CHECK). Parallel over tokens; the result does
// not depend on the thread count.
void engram_gate_update(std::span<float> x, std::span<const float> kv, std::span<const uint16_t> q_weight,
                        std::span<const uint16_t> k_weight, const EngramGateShape& shape, float eps,
                        std::span<const uint8_t> takes_part, std::span<float> gates_out, ThreadPool& pool,
                        EngramGateScratch& scratch);

// The gate's scalar tail: sigmoid(copysign(sqrt(max(|dot|, 1e-6)), dot)) in f32 (NaN propagates).
float engram_gate_from_dot(float dot);

}  // namespace cedar::model
