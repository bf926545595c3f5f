// Block quantisers (quant.h): scalar code that follows kernel.py act_quant / fp4_act_quant step by step.
// These run on activations (a few thousand values per token), far from the weight-streaming hot path,
// so they stay scalar and obviously correct.
#include "ops/formats/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "ops/formats/formats.h"

namespace cedar::ops {
namespace {

// fp32(1/448) and fp32(1/6): the kernels multiply by these f32 constants.
constexpr float kFp8MaxInv = static_cast<float>(1.0 / 448.0);
constexpr float kFp4MaxInv = static_cast<float>(1.0 / 6.0);

// max |x| over a block; NaN propagates like torch.amax.
float block_amax(const float* x, size_t n) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (std::isnan(a)) return a;
    amax = std::max(amax, a);
  }
  return amax;
}

// torch's clamp_min(v, floor): NaN stays NaN.
float clamp_min_nan(float v, float floor) { return std::isnan(v) ? v : std::max(v, floor); }

float clamp_e2m1_range(float v) {
  if (std::isnan(v)) return v;
  return std::min(std::max(v, -kE2M1Max), kE2M1Max);
}

}  // namespace

float fp8_block_scale(const float* x) { return fp8_block_scale_of_amax(block_amax(x, kFp8ActBlock)); }

float fp8_block_scale_of_amax(float amax) {
  return pow2_round_up_scale(clamp_min_nan(amax, kFp8AmaxFloor), kFp8MaxInv);
}

namespace {

float fp4_e8m0_block_scale(const float* x, size_t block) {
  return pow2_round_up_scale(clamp_min_nan(block_amax(x, block), kFp4E8M0AmaxFloor), kFp4MaxInv);
}

// The E4M3 scale code for one block (the scale value is e4m3_to_f32 of it).
uint8_t fp4_e4m3_block_scale_code(const float* x, size_t block) {
  const float amax = clamp_min_nan(block_amax(x, block), kFp4E4M3AmaxFloor);
  return f32_to_e4m3(amax / kE2M1Max);
}

// E8M0 byte of a scale from pow2_round_up_scale: its f32 exponent field (NaN -> 0xFF).
uint8_t e8m0_of_scale(float s) {
  if (std::isnan(s)) return 0xFF;
  uint32_t u;
  std::memcpy(&u, &s, 4);
  return static_cast<uint8_t>(u >> 23);
}

void check_blocks(size_t n, size_t block, const char* what) {
  CEDAR_CHECK(block > 0 && n % block == 0, "%s: length %zu is not a multiple of the block %zu", what, n,
              block);
}

}  // namespace

float pow2_round_up_scale(float amax, float max_inv) {
  const float x = amax * max_inv;
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const int32_t exp = static_cast<int32_t>((bits >> 23) & 0xFF);
  const uint32_t man = bits & 0x7FFFFFu;
  const int32_t log2_ceil = exp - 127 + (man != 0 ? 1 : 0);
  const uint32_t out = static_cast<uint32_t>(log2_ceil + 127) << 23;
  float s;
  std::memcpy(&s, &out, 4);
  return s;
}

// ---- FP8 ----

void act_quant_fp8_f32_scales(const float* x, size_t n, uint8_t* codes, float* scales) {
  check_blocks(n, kFp8ActBlock, "act_quant_fp8");
  for (size_t b = 0; b < n / kFp8ActBlock; ++b) {
    const float* xb = x + b * kFp8ActBlock;
    const float s = fp8_block_scale(xb);
    scales[b] = s;
    for (size_t i = 0; i < kFp8ActBlock; ++i) codes[b * kFp8ActBlock + i] = f32_to_e4m3(xb[i] / s);
  }
}

void act_quant_fp8(const float* x, size_t n, uint8_t* codes, uint8_t* scales_e8m0) {
  check_blocks(n, kFp8ActBlock, "act_quant_fp8");
  for (size_t b = 0; b < n / kFp8ActBlock; ++b) {
    const float* xb = x + b * kFp8ActBlock;
    const float s = fp8_block_scale(xb);
    scales_e8m0[b] = e8m0_of_scale(s);
    for (size_t i = 0; i < kFp8ActBlock; ++i) codes[b * kFp8ActBlock + i] = f32_to_e4m3(xb[i] / s);
  }
}

void act_qdq_fp8_inplace(float* x, size_t n) {
  check_blocks(n, kFp8ActBlock, "act_qdq_fp8_inplace");
  const float* table = e4m3_table();
  for (size_t b = 0; b < n / kFp8ActBlock; ++b) {
    float* xb = x + b * kFp8ActBlock;
    const float s = fp8_block_scale(xb);
    for (size_t i = 0; i < kFp8ActBlock; ++i) xb[i] = round_bf16(table[f32_to_e4m3(xb[i] / s)] * s);
  }
}

void ref::fp8_dequant_e8m0(const uint8_t* codes, const uint8_t* scales_e8m0, size_t n, float* x, size_t block) {
  check_blocks(n, block, "fp8_dequant_e8m0");
  const float* table = e4m3_table();
  for (size_t b = 0; b < n / block; ++b) {  // one scale lookup per block (KV entries per step)
    const float s = e8m0_to_f32(scales_e8m0[b]);
    for (size_t i = b * block; i < (b + 1) * block; ++i) x[i] = table[codes[i]] * s;
  }
}

// ---- FP4 ----

void fp4_quant_e8m0(const float* x, size_t n, uint8_t* packed, uint8_t* scales_e8m0, size_t block) {
  check_blocks(n, block, "fp4_quant_e8m0");
  CEDAR_CHECK(block % 2 == 0, "fp4 block must be even");
  for (size_t b = 0; b < n / block; ++b) {
    const float* xb = x + b * block;
    const float s = fp4_e8m0_block_scale(xb, block);
    scales_e8m0[b] = e8m0_of_scale(s);
    for (size_t i = 0; i < block; i += 2) {
      const uint8_t lo = f32_to_e2m1(clamp_e2m1_range(xb[i] / s));
      const uint8_t hi = f32_to_e2m1(clamp_e2m1_range(xb[i + 1] / s));
      packed[(b * block + i) / 2] = pack_fp4_pair(lo, hi);
    }
  }
}

void fp4_quant_e4m3(const float* x, size_t n, uint8_t* packed, uint8_t* scales_e4m3, size_t block) {
  check_blocks(n, block, "fp4_quant_e4m3");
  CEDAR_CHECK(block % 2 == 0, "fp4 block must be even");
  for (size_t b = 0; b < n / block; ++b) {
    const float* xb = x + b * block;
    const uint8_t scode = fp4_e4m3_block_scale_code(xb, block);
    const float s = e4m3_to_f32(scode);
    scales_e4m3[b] = scode;
    for (size_t i = 0; i < block; i += 2) {
      const uint8_t lo = f32_to_e2m1(clamp_e2m1_range(xb[i] / s));
      const uint8_t hi = f32_to_e2m1(clamp_e2m1_range(xb[i + 1] / s));
      packed[(b * block + i) / 2] = pack_fp4_pair(lo, hi);
    }
  }
}

void fp4_qdq_e8m0_inplace(float* x, size_t n, size_t block) {
  check_blocks(n, block, "fp4_qdq_e8m0_inplace");
  for (size_t b = 0; b < n / block; ++b) {
    float* xb = x + b * block;
    const float s = fp4_e8m0_block_scale(xb, block);
    for (size_t i = 0; i < block; ++i)
      xb[i] = round_bf16(e2m1_to_f32(f32_to_e2m1(clamp_e2m1_range(xb[i] / s))) * s);
  }
}

void fp4_qdq_e4m3_inplace(float* x, size_t n, size_t block) {
  check_blocks(n, block, "fp4_qdq_e4m3_inplace");
  for (size_t b = 0; b < n / block; ++b) {
    float* xb = x + b * block;
    const float s = e4m3_to_f32(fp4_e4m3_block_scale_code(xb, block));
    for (size_t i = 0; i < block; ++i)
      xb[i] = round_bf16(e2m1_to_f32(f32_to_e2m1(clamp_e2m1_range(xb[i] / s))) * s);
  }
}

void ref::fp4_dequant_e8m0(const uint8_t* packed, const uint8_t* scales_e8m0, size_t n, float* x, size_t block) {
  check_blocks(n, block, "fp4_dequant_e8m0");
  CEDAR_CHECK(block % 2 == 0, "fp4 block must be even");
  const float* pairs = fp4_pair_table();
  for (size_t b = 0; b < n / block; ++b) {  // one scale lookup per block, both nibbles of a byte at once
    const float s = e8m0_to_f32(scales_e8m0[b]);
    for (size_t i = b * block; i < (b + 1) * block; i += 2) {
      const float* pair = pairs + 2 * packed[i / 2];
      x[i] = pair[0] * s;
      x[i + 1] = pair[1] * s;
    }
  }
}

void ref::fp4_dequant_e4m3(const uint8_t* packed, const uint8_t* scales_e4m3, size_t n, float* x, size_t block) {
  check_blocks(n, block, "fp4_dequant_e4m3");
  CEDAR_CHECK(block % 2 == 0, "fp4 block must be even");
  const float* pairs = fp4_pair_table();
  for (size_t b = 0; b < n / block; ++b) {  // one scale lookup per block, both nibbles of a byte at once
    const float s = e4m3_to_f32(scales_e4m3[b]);
    for (size_t i = b * block; i < (b + 1) * block; i += 2) {
      const float* pair = pairs + 2 * packed[i / 2];
      x[i] = pair[0] * s;
      x[i + 1] = pair[1] * s;
    }
  }
}

// ---- KV entries ----

void pack_main_kv_entry(const float* latent, uint8_t* entry) {
  fp4_quant_e4m3(latent, kMainKvDim, entry, entry + kMainKvDim / 2, kFp4E4M3Block);
}
void unpack_main_kv_entry(const uint8_t* entry, float* latent) {
  fp4_dequant_e4m3(entry, entry + kMainKvDim / 2, kMainKvDim, latent, kFp4E4M3Block);
}

void pack_index_key_entry(const float* key, uint8_t* entry) {
  fp4_quant_e8m0(key, kIndexKeyDim, entry, entry + kIndexKeyDim / 2, kFp4E8M0Block);
}
void unpack_index_key_entry(const uint8_t* entry, float* key) {
  fp4_dequant_e8m0(entry, entry + kIndexKeyDim / 2, kIndexKeyDim, key, kFp4E8M0Block);
}

void pack_window_kv_entry(const float* kv, uint8_t* entry) {
  act_quant_fp8(kv, kWindowKvDim, entry, entry + kWindowKvDim);
}
void unpack_window_kv_entry(const uint8_t* entry, float* kv) {
  fp8_dequant_e8m0(entry, entry + kWindowKvDim, kWindowKvDim, kv, kFp8ActBlock);
}

static_assert(kMainKvDim / 2 + kMainKvDim / kFp4E4M3Block == kMainKvEntryBytes);
static_assert(kIndexKeyDim / 2 + kIndexKeyDim / kFp4E8M0Block == kIndexKeyEntryBytes);
static_assert(kWindowKvDim + kWindowKvDim / kFp8ActBlock == kWindowKvEntryBytes);

}  // namespace cedar::ops
