// Block quantisers of the V4.1 reference kernels (spec §2.1, §2.2; kernel.py act_quant / fp4_act_quant)
// and the three packed KV-cache entry formats built from them (spec §5.1).
//
// Every input is a "bf16 tensor" held as floats (values bf16-representable); blocks run along the
// contiguous last dimension, so a [rows, k] matrix with k % block == 0 can be passed as one flat array
// of rows*k values. All arithmetic is f32 in the reference's order:
//
//   FP8 (block 32, UE8M0):  amax = max(max|x|, 1e-4);  s = pow2_round_up_scale(amax, fp32(1/448));
//                           q = e4m3_satfinite(x / s)                (x/s is an f32 division)
//   FP4 / E8M0 (block 32):  amax = max(max|x|, 6*2^-126);  s = pow2_round_up_scale(amax, fp32(1/6));
//                           q = e2m1(clamp(x / s, -6, 6))
//   FP4 / E4M3 (block 16):  amax = max(max|x|, 6*2^-9);   s = e4m3_satfinite(amax / 6)   (f32 division)
//                           q = e2m1(clamp(x / s, -6, 6))
//
// QDQ ("inplace") writes bf16(q * s) back; that product is always exactly representable in bf16, so the
// bf16 rounding never changes it (tests assert this).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops {

inline constexpr size_t kFp8ActBlock = 32;   // V4.1 activation block (weight_block_size 32)
inline constexpr size_t kFp4E8M0Block = 32;  // indexer q / index keys
inline constexpr size_t kFp4E4M3Block = 16;  // compressed main KV
inline constexpr float kFp8AmaxFloor = 1e-4f;
inline constexpr float kFp4E8M0AmaxFloor = 6.0f * 0x1p-126f;
inline constexpr float kFp4E4M3AmaxFloor = 6.0f * 0x1p-9f;

// 2^ceil(log2(amax * max_inv)) computed like the reference's fast_round_scale: take the f32 product's
// exponent field and add one when its mantissa field is nonzero. amax must be finite and > 0.
float pow2_round_up_scale(float amax, float max_inv);

// ---- FP8 activations (block 32, E8M0 scales) ----------------------------------------------------

// The power-of-two scale act_quant gives one block of 32. A block holding a NaN gets what the
// exponent arithmetic of pow2_round_up_scale makes of it (-0: its values decode to NaN or infinities).
float fp8_block_scale(const float* x);
// The same from the block's max |x| (no NaN in the block): what fp8_block_scale does after the max.
float fp8_block_scale_of_amax(float amax);
// x[n] (n % 32 == 0) -> codes[n] E4M3 and scales[n/32] E8M0 (one per block, in order).
void act_quant_fp8(const float* x, size_t n, uint8_t* codes, uint8_t* scales_e8m0);
// Same, with the scale returned as f32 (the 2^e value) instead of E8M0.
void act_quant_fp8_f32_scales(const float* x, size_t n, uint8_t* codes, float* scales);
// In-place quantise-dequantise: x <- bf16(e4m3(x/s) * s), block 32. n % 32 == 0.
void act_qdq_fp8_inplace(float* x, size_t n);

// ---- FP4 activations ----------------------------------------------------------------------------

// E8M0 variant: x[n] (n % block == 0) -> packed[n/2] (even element in the low nibble), scales[n/block].
void fp4_quant_e8m0(const float* x, size_t n, uint8_t* packed, uint8_t* scales_e8m0,
                    size_t block = kFp4E8M0Block);
// E4M3 variant: scales are E4M3 codes of amax/6 (not powers of two).
void fp4_quant_e4m3(const float* x, size_t n, uint8_t* packed, uint8_t* scales_e4m3,
                    size_t block = kFp4E4M3Block);
// In-place QDQ forms: x <- bf16(e2m1(clamp(x/s, ±6)) * s).
void fp4_qdq_e8m0_inplace(float* x, size_t n, size_t block = kFp4E8M0Block);
void fp4_qdq_e4m3_inplace(float* x, size_t n, size_t block = kFp4E4M3Block);

// Dequantisers (exact; the products are bf16-representable). n % block == 0. Decode runs them on the
// calling thread every step: the FP8 one over the whole window of every layer, the FP4 E4M3 one over
// the compressed entries each query selected. They are Highway vectors that build each code's value
// exactly and multiply as the scalar references below do, so the bits are the references' on every
// target (quant_exact.cc).
void fp4_dequant_e8m0(const uint8_t* packed, const uint8_t* scales_e8m0, size_t n, float* x,
                      size_t block = kFp4E8M0Block);
void fp4_dequant_e4m3(const uint8_t* packed, const uint8_t* scales_e4m3, size_t n, float* x,
                      size_t block = kFp4E4M3Block);
void fp8_dequant_e8m0(const uint8_t* codes, const uint8_t* scales_e8m0, size_t n, float* x,
                      size_t block = kFp8ActBlock);
namespace ref {
void fp4_dequant_e8m0(const uint8_t* packed, const uint8_t* scales_e8m0, size_t n, float* x,
                      size_t block = kFp4E8M0Block);
void fp4_dequant_e4m3(const uint8_t* packed, const uint8_t* scales_e4m3, size_t n, float* x,
                      size_t block = kFp4E4M3Block);
void fp8_dequant_e8m0(const uint8_t* codes, const uint8_t* scales_e8m0, size_t n, float* x,
                      size_t block = kFp8ActBlock);
}  // namespace ref

// ---- Packed KV-cache entries (spec §5.1). Layout: codes first, then scales, no padding. ----------
//
// unpack(pack(v)) equals the reference's QDQ of v bit for bit, so a cache that stores packed entries
// reproduces the reference's bf16 QDQ caches exactly.

// Compressed main KV: 512 values, FP4 E2M1 with one E4M3 scale per 16.
//   bytes [0, 256): packed codes;  [256, 288): 32 E4M3 scales.
inline constexpr size_t kMainKvDim = 512;
inline constexpr size_t kMainKvEntryBytes = 288;
void pack_main_kv_entry(const float* latent /*[512]*/, uint8_t* entry /*[288]*/);
void unpack_main_kv_entry(const uint8_t* entry /*[288]*/, float* latent /*[512]*/);

// Index key: 128 values, FP4 E2M1 with one E8M0 scale per 32.
//   bytes [0, 64): packed codes;  [64, 68): 4 E8M0 scales.
inline constexpr size_t kIndexKeyDim = 128;
inline constexpr size_t kIndexKeyEntryBytes = 68;
void pack_index_key_entry(const float* key /*[128]*/, uint8_t* entry /*[68]*/);
void unpack_index_key_entry(const uint8_t* entry /*[68]*/, float* key /*[128]*/);

// Window (SWA) KV: 512 values, FP8 E4M3 with one E8M0 scale per 32 (act_quant, amax floor 1e-4).
//   bytes [0, 512): E4M3 codes;  [512, 528): 16 E8M0 scales.
inline constexpr size_t kWindowKvDim = 512;
inline constexpr size_t kWindowKvEntryBytes = 528;
void pack_window_kv_entry(const float* kv /*[512]*/, uint8_t* entry /*[528]*/);
void unpack_window_kv_entry(const uint8_t* entry /*[528]*/, float* kv /*[512]*/);

}  // namespace cedar::ops
