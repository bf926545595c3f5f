#include "model/engram_module.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "ops/simd/dot_canonical.h"
#include "ops/simd/exact_math.h"
#include "ops/formats/formats.h"
#include "ops/block/norm.h"

namespace cedar::model {

namespace {
constexpr int kScaleBlock = 32;  // one E8M0 scale per 32 columns of a table row
}  // namespace

Status dequant_engram_rows(std::span<const uint8_t> table_codes, std::span<const uint8_t> table_scales,
                           int64_t table_rows, int head_dim, std::span<const int64_t> row_ids, std::span<float> out,
                           ThreadPool& pool) {
  CEDAR_CHECK(head_dim > 0 && head_dim % kScaleBlock == 0, "engram head_dim %d", head_dim);
  const size_t blocks = static_cast<size_t>(head_dim / kScaleBlock);
  CEDAR_CHECK(table_rows >= 0 && table_codes.size() == static_cast<size_t>(table_rows) * head_dim &&
                  table_scales.size() == static_cast<size_t>(table_rows) * blocks,
              "engram table view: %zu code bytes, %zu scale bytes for %lld rows of %d", table_codes.size(),
              table_scales.size(), static_cast<long long>(table_rows), head_dim);
  CEDAR_CHECK(out.size() == row_ids.size() * static_cast<size_t>(head_dim), "engram rows out: %zu floats for %zu rows",
              out.size(), row_ids.size());
  for (size_t r = 0; r < row_ids.size(); ++r) {
    if (row_ids[r] < 0 || row_ids[r] >= table_rows)
      return invalid_argument("engram: row id " + std::to_string(row_ids[r]) + " is outside the embedding table (" +
                              std::to_string(table_rows) +
                              " rows); the checkpoint's engram.embed does not match config.json's engram_* fields");
  }
  const float* e4m3 = ops::e4m3_table();
  const float* e8m0 = ops::e8m0_table();
  pool.parallel_for(row_ids.size(), 16, [&](size_t begin, size_t end, int) {
    for (size_t r = begin; r < end; ++r) {
      const size_t row = static_cast<size_t>(row_ids[r]);
      const uint8_t* codes = table_codes.data() + row * head_dim;  // [head_dim]
      const uint8_t* scales = table_scales.data() + row * blocks;   // [head_dim / 32]
      float* dst = out.data() + r * head_dim;                       // [head_dim]
      for (int c = 0; c < head_dim; ++c) {
        // f32 product (exact unless it lands in the f32 subnormal range), then bf16 RNE.
        dst[c] = ops::round_bf16(e4m3[codes[c]] * e8m0[scales[c / kScaleBlock]]);
      }
    }
  });
  return Status::ok_status();
}

float engram_gate_from_dot(float dot) {
  const float clamp_min = 1e-6f;  // torch casts the Python 1e-6 to the tensor's f32
  float mag = std::fabs(dot);
  if (mag < clamp_min) mag = clamp_min;  // NaN fails the comparison and stays NaN, as torch.clamp_min
  const float s = std::copysign(std::sqrt(mag), dot);
  return ops::sigmoid_f32(s);  // numerics contract: in double, rounded once
}

void engram_gate_update(std::span<float> x, std::span<const float> kv, std::span<const uint16_t> q_weight,
                        std::span<const uint16_t> k_weight, const EngramGateShape& shape, float eps,
                        std::span<const uint8_t> takes_part, std::span<float> gates_out, ThreadPool& pool,
                        EngramGateScratch& scratch) {
  const int64_t n = shape.n_tokens;
  const size_t hc = static_cast<size_t>(shape.hc);
  const size_t dim = static_cast<size_t>(shape.dim);
  CEDAR_CHECK(n >= 0 && hc > 0 && dim > 0, "engram gate shape %lld x %zu x %zu", static_cast<long long>(n), hc, dim);
  const size_t un = static_cast<size_t>(n);
  CEDAR_CHECK(x.size() == un * hc * dim, "engram x: %zu floats", x.size());
  CEDAR_CHECK(kv.size() == un * (hc + 1) * dim, "engram kv: %zu floats", kv.size());
  CEDAR_CHECK(q_weight.size() == hc * dim && k_weight.size() == hc * dim, "engram q/k weights: %zu, %zu",
              q_weight.size(), k_weight.size());
  CEDAR_CHECK(takes_part.empty() || takes_part.size() == un, "engram takes_part: %zu flags", takes_part.size());
  CEDAR_CHECK(gates_out.empty() || gates_out.size() == un * hc, "engram gates_out: %zu floats", gates_out.size());

  // weight = q_weight.float() * k_weight.float(), one f32 rounding.
  if (scratch.weight.size() < hc * dim) scratch.weight.resize(hc * dim);
  const size_t products = static_cast<size_t>(pool.size()) * dim;
  if (scratch.products.size() < products) scratch.products.resize(products);
  float* weight = scratch.weight.data();  // [hc, dim]
  for (size_t i = 0; i < hc * dim; ++i)
    weight[i] = ops::bf16_bits_to_f32(q_weight[i]) * ops::bf16_bits_to_f32(k_weight[i]);
  // self.dim ** -0.5 is a Python double; torch multiplies an f32 tensor by it as f32.
  const float inv_sqrt_dim = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));

  pool.parallel_for(un, 1, [&](size_t begin, size_t end, int thread) {
    float* hw = scratch.products.data() + static_cast<size_t>(thread) * dim;  // [dim] h * weight
    for (size_t t = begin; t < end; ++t) {
      const float* key_all = kv.data() + t * (hc + 1) * dim;  // [hc, dim]
      const float* value = key_all + hc * dim;                 // [dim]
      const bool text = takes_part.empty() || takes_part[t] != 0;
      for (size_t j = 0; j < hc; ++j) {
        float* h = x.data() + (t * hc + j) * dim;  // [dim]
        const float* key = key_all + j * dim;      // [dim]
        const float* w = weight + j * dim;         // [dim]
        const float rstd = ops::rms_rsqrt(h, dim, eps) * ops::rms_rsqrt(key, dim, eps);
        for (size_t d = 0; d < dim; ++d) hw[d] = h[d] * w[d];
        // The reference sums the fp32 tensor (h*w)*key: fp32 products, the sum in float64 rounded once.
        const float sum = static_cast<float>(ops::dot_rounded_products_f64(hw, key, dim));
        const float dot = (sum * rstd) * inv_sqrt_dim;
        // masked_fill(~mask, 0) after the gate is computed: image tokens add 0 * value.
        const float gate = text ? engram_gate_from_dot(dot) : 0.0f;
        if (!gates_out.empty()) gates_out[t * hc + j] = gate;
        for (size_t d = 0; d < dim; ++d) {
          const float gv = gate * value[d];
          h[d] = ops::round_bf16(h[d] + gv);
        }
      }
    }
  });
}

}  // namespace cedar::model
