// Plain scalar references for linear.h: the definitions the fast paths are tested against.
#include <cmath>

#include "core/check.h"
#include "ops/linear/activation_access.h"
#include "ops/simd/dot_canonical.h"
#include "ops/formats/formats.h"
#include "ops/linear/linear.h"
#include "ops/linear/linear_internal.h"
#include "ops/formats/quant.h"

namespace cedar::ops {

namespace {
size_t padded_rows(size_t m) { return (m + kActTileRows - 1) / kActTileRows * kActTileRows; }
}  // namespace

size_t fp8_act_scratch_floats(size_t m, size_t k) {
  const size_t plain = m * k + m * (k / kFp8ActBlock);
  if (m < kActTileMinRows) return plain;
  return plain + padded_rows(m) * k + padded_rows(m) * (k / kFp8ActBlock);
}

PreparedActivations quantize_activations(const float* x, size_t m, size_t k, std::span<float> scratch) {
  CEDAR_CHECK(k % kFp8ActBlock == 0, "activation width %zu is not a multiple of 32", k);
  CEDAR_CHECK(scratch.size() >= fp8_act_scratch_floats(m, k), "linear scratch too small: %zu < %zu",
              scratch.size(), fp8_act_scratch_floats(m, k));
  float* values = scratch.data();          // [m, k]
  float* scales = scratch.data() + m * k;  // [m, k/32]
  const float* table = e4m3_table();
  uint8_t codes[kFp8ActBlock];  // one block at a time
  for (size_t i = 0; i < m * k / kFp8ActBlock; ++i) {
    act_quant_fp8_f32_scales(x + i * kFp8ActBlock, kFp8ActBlock, codes, scales + i);
    for (size_t j = 0; j < kFp8ActBlock; ++j) values[i * kFp8ActBlock + j] = table[codes[j]];
  }
  ActivationLayout a{values, scales, m, k};
  if (m >= kActTileMinRows) {
    // Row-interleaved copies: tile t, column c, row r of the tile at [(t * k + c) * 16 + r].
    const size_t kblocks = k / kFp8ActBlock;
    float* values_t = scales + m * kblocks;              // [tiles, k, 16]
    float* scales_t = values_t + padded_rows(m) * k;     // [tiles, kblocks, 16]
    for (size_t t = 0; t < padded_rows(m) / kActTileRows; ++t) {
      for (size_t r = 0; r < kActTileRows; ++r) {
        const size_t row = t * kActTileRows + r;
        for (size_t c = 0; c < k; ++c) values_t[(t * k + c) * kActTileRows + r] = row < m ? values[row * k + c] : 0.0f;
        for (size_t b = 0; b < kblocks; ++b)
          scales_t[(t * kblocks + b) * kActTileRows + r] = row < m ? scales[row * kblocks + b] : 0.0f;
      }
    }
    a.values_t = values_t;
    a.scales_t = scales_t;
  }
  return ActivationAccess::wrap(a);
}

void dequantize_fp8_weight_to_bf16(const Fp8Weight& w, uint16_t* out_bits) {
  dequantize_fp8_rows_to_bf16(w, 0, w.n, out_bits);
}

void dequantize_fp8_rows_to_bf16(const Fp8Weight& w, size_t n_begin, size_t n_end, uint16_t* out_bits) {
  const size_t kblocks = (w.k + 31) / 32;
  const float* table = e4m3_table();
  for (size_t n = n_begin; n < n_end; ++n) {
    for (size_t k = 0; k < w.k; ++k) {
      const float s = e8m0_to_f32(w.scales[(n / 32) * kblocks + k / 32]);
      out_bits[(n - n_begin) * w.k + k] = f32_to_bf16_bits(table[w.codes[n * w.k + k]] * s);
    }
  }
}

namespace ref {

void gemm_fp8(const PreparedActivations& act, const Fp8Weight& w, float* y) {
  const ActivationLayout& a = ActivationAccess::layout(act);
  CEDAR_CHECK(a.k == w.k && w.k % 32 == 0, "gemm_fp8: k mismatch (%zu vs %zu)", a.k, w.k);
  const size_t kblocks = w.k / 32;
  const float* table = e4m3_table();
  float wblock[32];  // one decoded weight block
  for (size_t m = 0; m < a.m; ++m) {
    for (size_t n = 0; n < w.n; ++n) {
      float acc = 0.0f;
      for (size_t kb = 0; kb < kblocks; ++kb) {
        for (size_t j = 0; j < 32; ++j) wblock[j] = table[w.codes[n * w.k + kb * 32 + j]];
        const float part = block_dot32_exact(a.values + m * a.k + kb * 32, wblock);
        const float sw = e8m0_to_f32(w.scales[(n / 32) * kblocks + kb]);
        acc += (part * a.scales[m * kblocks + kb]) * sw;
      }
      y[m * w.n + n] = round_bf16(acc);
    }
  }
}

void gemm_fp4(const PreparedActivations& act, const Fp4Weight& w, float* y) {
  const ActivationLayout& a = ActivationAccess::layout(act);
  CEDAR_CHECK(a.k == w.k && w.k % 32 == 0, "gemm_fp4: k mismatch (%zu vs %zu)", a.k, w.k);
  const size_t kblocks = w.k / 32;
  float wblock[32];
  for (size_t m = 0; m < a.m; ++m) {
    for (size_t n = 0; n < w.n; ++n) {
      float acc = 0.0f;
      for (size_t kb = 0; kb < kblocks; ++kb) {
        unpack_fp4_values(w.packed + n * (w.k / 2) + kb * 16, 32, wblock);
        const float part = block_dot32_exact(a.values + m * a.k + kb * 32, wblock);
        const float sw = e8m0_to_f32(w.scales[n * kblocks + kb]);
        acc += (part * a.scales[m * kblocks + kb]) * sw;
      }
      y[m * w.n + n] = round_bf16(acc);
    }
  }
}

void linear_bf16(const float* x, size_t m, const Bf16Weight& w, float* y, LinearOut out) {
  for (size_t i = 0; i < m; ++i) {
    for (size_t n = 0; n < w.n; ++n) {
      const uint16_t* wrow = w.bits + n * w.k;
      // bf16 activation x bf16 weight: the fp32 product is exact, so this is the exact dot.
      const float acc = static_cast<float>(dot_rounded_products_f64(
          x + i * w.k, [wrow](size_t k) { return bf16_bits_to_f32(wrow[k]); }, w.k));
      y[i * w.n + n] = out == LinearOut::kBf16 ? round_bf16(acc) : acc;
    }
  }
}

void linear_f32(const float* x, size_t m, const F32Weight& w, float* y) {
  for (size_t i = 0; i < m; ++i) {
    for (size_t n = 0; n < w.n; ++n) {
      y[i * w.n + n] = dot_canonical(x + i * w.k, w.data + n * w.k, w.k);
    }
  }
}

}  // namespace ref
}  // namespace cedar::ops
