// The FP4 GEMV for x86 CPUs with AVX512-VNNI (+VL, BW): Ice Lake server and later, Zen 4 and later.
// The fast kernels take it for GEMV-sized rows (fast::quantize_activations packs its byte planes when
// the CPU has the extensions); elsewhere the Highway integer kernel (linear_fast.cc) runs.
//
// Why a second FP4 kernel: the Highway one widens the decoded weights to int16 (two byte unpacks per
// 32) and turns every block's partial sums to float alone (convert, broadcast of the scale, FMA): 13
// vector operations per 32 weights, compute-bound at about 12 GB/s per core where a core reads 30.
// Here the weights stay bytes and meet the activations in `vpdpbusd` (unsigned x signed bytes, four
// products per int32 lane):
//   * weights: the low and high nibbles of 64 packed bytes (four blocks, one zmm) are looked up as
//     w' = 2·E2M1 + 12, an unsigned byte 0..24, so one byte shuffle per 64 weights decodes them;
//   * activations: each block's int16 plane value p (Fp4GemvPlanes, |p| <= 15·2^11 = 30720) is split
//     into signed bytes p = 256·hi + lo (hi in -120..120, lo in -128..127), so Σ w'·p = 256·Σ w'·hi
//     + Σ w'·lo is two byte dot products; Σ 2·E2M1·p = Σ w'·p - 12·Σ p, the correction 12·Σ p being
//     per block and computed once with the planes;
//   * eight blocks' lanes are added to one int32 per block (two unpacks, a shuffle and a permute), the
//     correction is subtracted and the eight sums become floats at once, each an exact integer below 2^24
//     (|Σ 2·E2M1·p| <= 32·12·30720), then one FMA applies the eight blocks' scales.
// So the only rounding is the fp32 accumulation across blocks, as in the Highway kernel, and the
// residual blocks of the planes (elements below the int16 plane's precision) are added exactly.
//
// On CPUs that also have AVX512-BF16 with a fast `vdpbf16ps` (Zen 4 and later: has_fast_avx512_bf16_dot)
// a second form runs instead, with half the multiply instructions: the weights decode to bf16 and meet
// the activations in `vdpbf16ps` (two products per fp32 lane):
//   * weights: 64 packed bytes (four blocks, one per 128-bit lane) are read as 32 words of four
//     nibbles, and one `vpermw` per 32 weights looks up the bf16 bits of the E2M1 value (0, ±0.5 ..
//     ±6) from the word shifted right by 0, 4, 8 or 12; the fp32 lanes of the dot products are per
//     block, and one FMA applies the four blocks' scales;
//   * activations: the quantised values q·s, exactly bf16 numbers (an E4M3 value has 4 significant
//     bits), laid out once per call in the weights' lane order (fp4_bf16_pack_row);
//   * every product of a bf16 activation and an E2M1 value is exact in fp32, so again the only
//     rounding is fp32 accumulation. The instruction treats subnormal inputs as zero and flushes
//     subnormal results: the layout is only built when every activation is zero or at least 2^-125 in
//     magnitude, so no product (>= 2^-126) is flushed; a partial sum that cancels into the subnormal
//     range is, an absolute error below 2^-126 per addition (as in x86_gemm_bf16.h). The weight scale
//     is applied by an ordinary FMA, so 2^-127 scales are not flushed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops {
struct Fp4GemvPlanes;
}

namespace cedar::ops::x86 {

// Whether this CPU has AVX512-F/BW/VL and AVX512-VNNI and tests have not turned the kernel off.
bool fp4_gemv_vnni_usable();
// Tests: false makes fast::quantize_activations pack the Highway kernel's planes instead, so both run.
void set_fp4_gemv_vnni_allowed(bool allowed);

// Byte-plane layout, per activation row: blocks padded to a multiple of 8 (zeros), in quads of 256
// bytes: for blocks 4i..4i+3 the high bytes of the even elements (16 per block, in block order), the
// high bytes of the odd elements, then the low bytes likewise. The correction 12·Σ p of the row's
// blocks, [fp4_vnni_padded_blocks], in block order.
size_t fp4_vnni_padded_blocks(size_t kblocks);
// Writes block kb of one row (p: its 32 plane values in element order, |p| <= 30720) into that row's
// byte plane and correction array: AVX-512 where the CPU has it, else the scalar reference below,
// which it equals byte for byte.
void fp4_vnni_pack_block(const int32_t* p, size_t kb, int8_t* row_plane, int32_t* row_correction);
void fp4_vnni_pack_block_scalar(const int32_t* p, size_t kb, int8_t* row_plane, int32_t* row_correction);

// y[r * n_total + n] = bf16( Σ_k act[r, k] · w[n, k] ) for rows r < m (1..4) of `planes` (packed for
// this kernel) and weight rows [n_begin, n_end): wdata [n_total, k/2] packed E2M1 (even element in the
// low nibble), wscales [n_total, k/32] E8M0. Only callable when fp4_gemv_vnni_usable().
void fp4_gemv_vnni(const Fp4GemvPlanes& planes, size_t m, const float* ascales, const uint8_t* wdata,
                   const uint8_t* wscales, size_t n_total, size_t k, float* y, size_t n_begin, size_t n_end);

// Whether the bf16 form runs: the CPU has AVX512-F/BW and AVX512-BF16 with a fast `vdpbf16ps`
// (has_fast_avx512_bf16_dot: on Intel's cores the VNNI form is the faster one, 18 against 12-13 GB/s
// in L3 on a Xeon with AMX), or tests forced it; and tests have not turned it off.
bool fp4_gemv_bf16_usable();
// Tests: false makes fast::quantize_activations pack the VNNI (or Highway) planes instead.
void set_fp4_gemv_bf16_allowed(bool allowed);
// Tests: true runs the bf16 form on every CPU with AVX512-BF16, so that it is tested there too.
void set_fp4_gemv_bf16_forced(bool forced);

// The bf16 layout of one activation row of width k (a multiple of 32): 128 u16 per group of four
// blocks (the last group zero-padded), in four runs of 32: run r holds elements r, r + 4, ..., r + 28
// of the group's blocks 0-3 (8 per block, block b at 8b), the order in which the weights' 16-bit words
// yield their nibbles.
size_t fp4_bf16_plane_words(size_t k);
// Writes a row's layout from its quantised values (exact bf16 numbers); false when a value is
// nonzero and below 2^-125 in magnitude (or not a bf16 number), and then the layout must not be used.
// AVX-512 where the CPU has the form, else the scalar reference below, which it equals word for word.
bool fp4_bf16_pack_row(const float* values, size_t k, uint16_t* plane);
bool fp4_bf16_pack_row_scalar(const float* values, size_t k, uint16_t* plane);

// y[r * n_total + n] = bf16( Σ_k act[r, k] · w[n, k] ) for rows r < m (1..4) of `plane` (m layouts of
// fp4_bf16_plane_words(k) each) and weight rows [n_begin, n_end): wdata [n_total, k/2] packed E2M1,
// wscales [n_total, k/32] E8M0 (0 and 255 included). Only callable when fp4_gemv_bf16_usable().
void fp4_gemv_bf16(const uint16_t* plane, size_t m, const uint8_t* wdata, const uint8_t* wscales, size_t n_total,
                   size_t k, float* y, size_t n_begin, size_t n_end);

}  // namespace cedar::ops::x86
