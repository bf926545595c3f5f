// The AVX512-VNNI FP4 GEMV of x86_fp4_gemv.h. The functions that use the extensions carry them as
// target attributes, so this file builds for any x86-64 baseline and is only entered after the
// run-time check.
#include "ops/linear/x86_fp4_gemv.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "ops/formats/formats.h"
#include "ops/linear/linear.h"
#include "ops/simd/prefetch.h"
#include "ops/simd/x86_features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CEDAR_FP4_GEMV_X86 1
#include "ops/simd/x86_lane_sum.h"
#endif

namespace cedar::ops::x86 {
namespace {
std::atomic<bool> g_allowed{true};
std::atomic<bool> g_bf16_allowed{true};
std::atomic<bool> g_bf16_forced{false};

constexpr int kWeightOffset = 12;  // w' = 2·E2M1 + 12
constexpr uint32_t kMinBf16ActBits = 0x01000000;  // f32 bits of 2^-125
}  // namespace

void set_fp4_gemv_vnni_allowed(bool allowed) { g_allowed.store(allowed, std::memory_order_relaxed); }
void set_fp4_gemv_bf16_allowed(bool allowed) { g_bf16_allowed.store(allowed, std::memory_order_relaxed); }
void set_fp4_gemv_bf16_forced(bool forced) { g_bf16_forced.store(forced, std::memory_order_relaxed); }

size_t fp4_bf16_plane_words(size_t k) { return (k + 127) / 128 * 128; }

bool fp4_bf16_pack_row_scalar(const float* values, size_t k, uint16_t* plane) {
  std::fill(plane, plane + fp4_bf16_plane_words(k), uint16_t{0});
  bool ok = true;
  for (size_t j = 0; j < k; ++j) {
    uint32_t bits;
    std::memcpy(&bits, &values[j], sizeof(bits));
    const uint32_t magnitude = bits & 0x7FFFFFFFu;
    ok &= (bits & 0xFFFFu) == 0 && (magnitude == 0 || magnitude >= kMinBf16ActBits);
    // Element e of block b of group g: run e % 4, word 8 b + e / 4 of it.
    const size_t g = j / 128, b = (j / 32) % 4, e = j % 32;
    plane[g * 128 + (e % 4) * 32 + 8 * b + e / 4] = static_cast<uint16_t>(bits >> 16);
  }
  return ok;
}

size_t fp4_vnni_padded_blocks(size_t kblocks) { return (kblocks + 7) / 8 * 8; }

void fp4_vnni_pack_block_scalar(const int32_t* p, size_t kb, int8_t* row_plane, int32_t* row_correction) {
  int8_t* quad = row_plane + (kb / 4) * 256 + (kb % 4) * 16;
  int32_t sum = 0;
  for (size_t j = 0; j < 32; ++j) {
    const int32_t hi = (p[j] + 128) >> 8;  // rounds p / 256 to nearest: |hi| <= 120 for |p| <= 30720
    const int32_t lo = p[j] - 256 * hi;     // -128..127
    int8_t* slot = quad + (j % 2) * 64 + j / 2;
    slot[0] = static_cast<int8_t>(hi);
    slot[128] = static_cast<int8_t>(lo);
    sum += p[j];
  }
  row_correction[kb] = kWeightOffset * sum;
}

#ifdef CEDAR_FP4_GEMV_X86

namespace {

// 2·E2M1 + 12 of each 4-bit code (codes 8..15 are the negatives of 0..7).
alignas(16) constexpr int8_t kE2m1Offset[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

#define CEDAR_X86_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))

// Σ over each of 8 blocks of w'·p for R activation rows, lane b holding block g + b: `blocks` (1..8)
// of them are present from block g on; the others count zero (their plane bytes are zero padding).
// A zmm step takes four blocks (64 packed bytes): one byte shuffle per 64 weights, four `vpdpbusd`
// per row (the high and low activation bytes, each against the even and odd weights).
template <size_t R>
CEDAR_X86_TARGET inline void group_sums(const uint8_t* wrow, size_t g, size_t blocks, const int8_t* const* plane,
                                        __m256i* sums) {
  // The zero-masked forms with every lane set: GCC 12's plain forms of these intrinsics start from an
  // undefined vector and trip -Wmaybe-uninitialized.
  constexpr __mmask16 kAll = 0xFFFF;
  constexpr __mmask8 kAll64 = 0xFF;
  const __m512i table =
      _mm512_maskz_broadcast_i32x4(kAll, _mm_load_si128(reinterpret_cast<const __m128i*>(kE2m1Offset)));
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  __m512i quad_sum[R][2];
  for (size_t q = 0; q < 2; ++q) {
    const uint8_t* src = wrow + (g + 4 * q) * 16;
    __m512i packed;
    if (blocks == 8) {
      packed = _mm512_loadu_si512(src);
    } else {
      // Bytes past the row's last block are not read: codes 0 there meet zero plane bytes.
      const size_t bytes = std::min<size_t>(64, blocks > 4 * q ? (blocks - 4 * q) * 16 : 0);
      packed = _mm512_maskz_loadu_epi8(bytes == 64 ? ~__mmask64{0} : (__mmask64{1} << bytes) - 1, src);
    }
    const __m512i even = _mm512_shuffle_epi8(table, _mm512_and_si512(packed, nibble));
    const __m512i high_nibbles = _mm512_maskz_srli_epi16(~__mmask32{0}, packed, 4);
    const __m512i odd = _mm512_shuffle_epi8(table, _mm512_and_si512(high_nibbles, nibble));
    for (size_t r = 0; r < R; ++r) {
      const int8_t* at = plane[r] + (g / 4 + q) * 256;
      const auto bytes = [at](size_t off) CEDAR_X86_TARGET { return _mm512_loadu_si512(at + off); };
      // 256·Σ w'·hi + Σ w'·lo, the two as separate chains.
      const __m512i zero = _mm512_setzero_si512();
      const __m512i hi = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, even, bytes(0)), odd, bytes(64));
      const __m512i lo = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, even, bytes(128)), odd, bytes(192));
      quad_sum[r][q] = _mm512_add_epi32(_mm512_maskz_slli_epi32(kAll, hi, 8), lo);
    }
  }
  // quad_sum[q] holds block g + 4q + i in 128-bit lane i (4 int32 each). The two quads' halves are
  // added within each 128-bit lane (quad 0 in int32 lane 0, quad 1 in lane 2), then one permute puts
  // the eight block sums in order. A lane sums at most 8 products below 2^13·2^8 and a block 32:
  // below 2^25, no overflow.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
  for (size_t r = 0; r < R; ++r) {
    const __m512i halves = _mm512_add_epi32(_mm512_maskz_unpacklo_epi64(kAll64, quad_sum[r][0], quad_sum[r][1]),
                                            _mm512_maskz_unpackhi_epi64(kAll64, quad_sum[r][0], quad_sum[r][1]));
    const __m512i whole = _mm512_add_epi32(halves, _mm512_maskz_shuffle_epi32(kAll, halves, _MM_PERM_CDAB));
    sums[r] = _mm512_maskz_extracti64x4_epi64(0xF, _mm512_maskz_permutexvar_epi32(kAll, order, whole), 0);
  }
}

// 2·E2M1 of each 4-bit code.
alignas(16) constexpr int8_t kE2m1Twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Per-lane sums of 256·2·E2M1 · plane over one block whose int16 plane is in fp4_plane_slot order:
// the 16 bytes go to both 128-bit lanes, the low lane keeps the low nibbles (even elements) and the
// high lane the high ones, and interleaving under zero bytes widens to int16 (times 256).
CEDAR_X86_TARGET inline __m256i residual_block_sum(const uint8_t* block, const int16_t* plane) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kE2m1Twice)));
  const __m256i packed = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
  const __m256i nibbles =
      _mm256_and_si256(_mm256_blend_epi32(packed, _mm256_srli_epi16(packed, 4), 0xF0), _mm256_set1_epi8(0x0F));
  const __m256i twice = _mm256_shuffle_epi8(table, nibbles);
  const __m256i lo = _mm256_unpacklo_epi8(_mm256_setzero_si256(), twice);
  const __m256i hi = _mm256_unpackhi_epi8(_mm256_setzero_si256(), twice);
  const __m256i sum = _mm256_madd_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(plane)));
  return _mm256_add_epi32(sum, _mm256_madd_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(plane + 16))));
}

// The sum of the 8 lanes.
CEDAR_X86_TARGET inline float sum_lanes(__m256 v) {
  __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  four = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(four, _mm_movehdup_ps(four)));
}

template <size_t R>
CEDAR_X86_TARGET void gemv_rows(const Fp4GemvPlanes& planes, const float* ascales, const uint8_t* wdata,
                                const uint8_t* wscales, size_t n_total, size_t k, float* y, size_t n_begin,
                                size_t n_end) {
  const size_t kblocks = k / 32;
  const size_t padded = fp4_vnni_padded_blocks(kblocks);
  const float* e8m0 = e8m0_table();
  const __m256 unscale = _mm256_set1_ps(256.0f);  // planes.factor is for the Highway kernel's 256·2·E2M1
  const int8_t* plane[R];
  for (size_t r = 0; r < R; ++r) plane[r] = planes.vnni_plane + r * padded * 64;
  for (size_t n = n_begin; n < n_end; ++n) {
    const uint8_t* wrow = wdata + n * (k / 2);
    const uint8_t* srow = wscales + n * kblocks;
    __m256 acc[R];
    for (size_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (size_t g = 0; g < kblocks; g += 8) {
      const size_t blocks = std::min<size_t>(8, kblocks - g);
      prefetch_weight_stream(wrow + g * 16);
      prefetch_weight_stream(wrow + g * 16 + 64);
      __m256i sums[R];
      group_sums<R>(wrow, g, blocks, plane, sums);
      // The weight scales as floats: E8M0 e is the float with exponent field e for 1 <= e <= 254;
      // 0 (2^-127), 255 (NaN) and a short group take the table.
      bool general = blocks == 8;
      __m256 weight_scale = _mm256_setzero_ps();
      if (general) {
        const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(srow + g)));
        general = (_mm256_cmpeq_epi32_mask(e, _mm256_setzero_si256()) |
                   _mm256_cmpeq_epi32_mask(e, _mm256_set1_epi32(255))) == 0;
        weight_scale = _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
      }
      if (!general) {
        alignas(32) float s[8] = {};
        for (size_t b = 0; b < blocks; ++b) s[b] = e8m0[srow[g + b]];
        weight_scale = _mm256_load_ps(s);
      }
      for (size_t r = 0; r < R; ++r) {
        // Factors past the row's blocks are never read: a short group's lanes there get a zero scale.
        const __m256 factor = blocks == 8 ? _mm256_loadu_ps(planes.factor + r * kblocks + g)
                                          : _mm256_maskz_loadu_ps(static_cast<__mmask8>((1u << blocks) - 1),
                                                                  planes.factor + r * kblocks + g);
        const __m256 scale = _mm256_mul_ps(weight_scale, _mm256_mul_ps(factor, unscale));
        const __m256i exact = _mm256_sub_epi32(
            sums[r], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(planes.vnni_correction + r * padded + g)));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(exact), scale, acc[r]);
      }
    }
    for (size_t r = 0; r < R; ++r) {
      // Residual blocks (linear.h): Σ 256·2·E2M1 · (v mod 2^shift) on the int16 residual plane, exact
      // integers, times 2^-18·s·s_w, as the Highway kernel adds them.
      for (uint32_t i = 0; i < planes.residual_count[r]; ++i) {
        const size_t rb = planes.residual_block[r * kblocks + i];
        const int16_t* rp = planes.residual_plane + (r * kblocks + i) * 32;
        const float f = e8m0[srow[rb]] * ascales[r * kblocks + rb] * 0x1p-18f;
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(residual_block_sum(wrow + rb * 16, rp)), _mm256_set1_ps(f), acc[r]);
      }
      y[r * n_total + n] = round_bf16(sum_lanes(acc[r]));
    }
  }
}

// fp4_vnni_pack_block in zmm registers: the even and odd elements gathered by two permutes, split
// into high and low bytes as the scalar code does ((p + 128) >> 8 and p - 256·high, both within int8),
// narrowed with vpmovdb and stored to their four 16-byte slots.
CEDAR_X86_TARGET void pack_block_avx512(const int32_t* p, size_t kb, int8_t* row_plane, int32_t* row_correction) {
  const __m512i first = _mm512_loadu_si512(p), second = _mm512_loadu_si512(p + 16);
  const __m512i even_index = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_index = _mm512_add_epi32(even_index, _mm512_set1_epi32(1));
  int8_t* quad = row_plane + (kb / 4) * 256 + (kb % 4) * 16;
  // The zero-masked forms with every lane set, and the sum through memory: GCC 12's plain shift,
  // narrowing and reduction intrinsics start from an undefined vector and trip -Wuninitialized.
  constexpr __mmask16 kAll = 0xFFFF;
  const auto store_split = [&](__m512i v, int8_t* high_slot) CEDAR_X86_TARGET {
    const __m512i high = _mm512_maskz_srai_epi32(kAll, _mm512_add_epi32(v, _mm512_set1_epi32(128)), 8);
    const __m512i low = _mm512_sub_epi32(v, _mm512_maskz_slli_epi32(kAll, high, 8));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(high_slot), _mm512_maskz_cvtepi32_epi8(kAll, high));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(high_slot + 128), _mm512_maskz_cvtepi32_epi8(kAll, low));
  };
  store_split(_mm512_permutex2var_epi32(first, even_index, second), quad);
  store_split(_mm512_permutex2var_epi32(first, odd_index, second), quad + 64);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, _mm512_add_epi32(first, second));
  int32_t sum = 0;
  for (int32_t lane : lanes) sum += lane;
  row_correction[kb] = kWeightOffset * sum;
}

#undef CEDAR_X86_TARGET

#define CEDAR_X86_BF16_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512bf16")))

// fp4_bf16_pack_row in zmm registers: a group's four blocks become bf16 words (vcvtne2ps2bf16, exact for
// bf16 numbers), then two rounds of two-source word permutes sort them into the four runs.
CEDAR_X86_BF16_TARGET bool pack_row_avx512(const float* values, size_t k, uint16_t* plane) {
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i below_min = _mm512_set1_epi32(static_cast<int>(kMinBf16ActBits - 1));
  const __m512i one = _mm512_set1_epi32(1);
  // Stage 1 (blocks b, b + 1 -> one vector): runs 0 and 1 of both (elements 4q and 4q + 1 of block b
  // at q and 16 + q, of block b + 1 at 8 + q and 24 + q); +2 for runs 2 and 3. Stage 2: the first or
  // second halves of two such vectors.
  alignas(64) uint16_t runs01[32], runs23[32], first_half[32], second_half[32];
  for (int r = 0; r < 2; ++r) {
    for (int q = 0; q < 8; ++q) {
      runs01[16 * r + q] = static_cast<uint16_t>(4 * q + r);
      runs01[16 * r + 8 + q] = static_cast<uint16_t>(32 + 4 * q + r);
    }
  }
  for (int i = 0; i < 32; ++i) {
    runs23[i] = static_cast<uint16_t>(runs01[i] + 2);
    first_half[i] = static_cast<uint16_t>(i < 16 ? i : 32 + i - 16);
    second_half[i] = static_cast<uint16_t>(first_half[i] + 16);
  }
  const __m512i idx01 = _mm512_load_si512(runs01), idx23 = _mm512_load_si512(runs23);
  const __m512i idx_first = _mm512_load_si512(first_half), idx_second = _mm512_load_si512(second_half);
  __mmask16 bad = 0;
  for (size_t g = 0; g * 128 < k; ++g) {
    __m512i block[4];
    for (size_t b = 0; b < 4; ++b) {
      const size_t at = g * 128 + b * 32;
      __m512 v[2];
      for (size_t h = 0; h < 2; ++h)
        v[h] = at < k ? _mm512_loadu_ps(values + at + 16 * h) : _mm512_setzero_ps();
      for (const __m512 x : v) {
        const __m512i bits = _mm512_castps_si512(x);
        bad |= _mm512_test_epi32_mask(bits, low16);
        // Nonzero below 2^-125 (magnitude - 1 wraps for zero).
        bad |= _mm512_cmplt_epu32_mask(_mm512_sub_epi32(_mm512_and_si512(bits, magnitude), one), below_min);
      }
      block[b] = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v[1], v[0]));
    }
    const __m512i runs01_of01 = _mm512_maskz_permutex2var_epi16(~__mmask32{0}, block[0], idx01, block[1]);
    const __m512i runs01_of23 = _mm512_maskz_permutex2var_epi16(~__mmask32{0}, block[2], idx01, block[3]);
    const __m512i runs23_of01 = _mm512_maskz_permutex2var_epi16(~__mmask32{0}, block[0], idx23, block[1]);
    const __m512i runs23_of23 = _mm512_maskz_permutex2var_epi16(~__mmask32{0}, block[2], idx23, block[3]);
    uint16_t* out = plane + g * 128;
    _mm512_storeu_si512(out, _mm512_maskz_permutex2var_epi16(~__mmask32{0}, runs01_of01, idx_first, runs01_of23));
    _mm512_storeu_si512(out + 32, _mm512_maskz_permutex2var_epi16(~__mmask32{0}, runs01_of01, idx_second, runs01_of23));
    _mm512_storeu_si512(out + 64, _mm512_maskz_permutex2var_epi16(~__mmask32{0}, runs23_of01, idx_first, runs23_of23));
    _mm512_storeu_si512(out + 96, _mm512_maskz_permutex2var_epi16(~__mmask32{0}, runs23_of01, idx_second, runs23_of23));
  }
  return bad == 0;
}

// The E8M0 scales of `count` (1..16) consecutive blocks as floats in lanes 0..count-1, zeros above.
// Without a 0 or 255 byte each is the float with that exponent field (a shift); else the table
// gives 2^-127 and NaN.
CEDAR_X86_BF16_TARGET inline __m512 block_scales16(const uint8_t* bytes, size_t count, const float* e8m0) {
  constexpr __mmask16 kAll = 0xFFFF;  // (the masked forms: GCC 12's plain ones warn of an undefined start)
  const __mmask64 valid = (__mmask64{1} << count) - 1;
  const __m512i loaded = _mm512_maskz_loadu_epi8(valid, bytes);
  const __mmask64 special = (_mm512_cmpeq_epi8_mask(loaded, _mm512_setzero_si512()) |
                             _mm512_cmpeq_epi8_mask(loaded, _mm512_set1_epi8(-1))) & valid;
  if (special == 0) return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(
        kAll, _mm512_maskz_cvtepu8_epi32(kAll, _mm512_maskz_extracti32x4_epi32(0xF, loaded, 0)), 23));
  alignas(64) float s[16] = {};
  for (size_t b = 0; b < count; ++b) s[b] = e8m0[bytes[b]];
  return _mm512_load_ps(s);
}

// Per group of four blocks (64 packed bytes, one block per 128-bit lane), word q of a lane holds the
// block's elements 4q .. 4q + 3 in its four nibbles: shifting the words right by 0, 4, 8 and 12 brings
// each into the low bits vpermw indexes, so the four runs decode without widening the bytes. The
// scales are read 16 blocks at a time and spread to the group's lanes by one permute.
template <size_t R>
CEDAR_X86_BF16_TARGET void gemv_rows_bf16(const uint16_t* plane, const uint8_t* wdata, const uint8_t* wscales,
                                          size_t n_total, size_t k, float* y, size_t n_begin, size_t n_end) {
  constexpr __mmask16 kAll = 0xFFFF;
  constexpr __mmask32 kAllWords = ~__mmask32{0};
  const size_t kblocks = k / 32, groups = (kblocks + 3) / 4, full = kblocks / 4;
  const size_t words = groups * 128;
  const float* e8m0 = e8m0_table();
  const __m512i table = _mm512_load_si512(kE2m1Bf16Words.bits);
  // Group j of the 16 scales: block b's scale (lane 4 j + b) in the four lanes of 128-bit lane b.
  __m512i spread[4];
  for (int j = 0; j < 4; ++j)
    spread[j] = _mm512_set_epi32(4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 3, 4 * j + 2, 4 * j + 2, 4 * j + 2,
                                 4 * j + 2, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j + 1, 4 * j, 4 * j, 4 * j, 4 * j);
  for (size_t n = n_begin; n < n_end; ++n) {
    const uint8_t* wrow = wdata + n * (k / 2);
    const uint8_t* srow = wscales + n * kblocks;
    __m512 acc[R][2];
    for (size_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    __m512 scales16 = _mm512_setzero_ps();
    for (size_t g = 0; g < groups; ++g) {
      prefetch_weight_stream(wrow + g * 64);
      if (g % 4 == 0) scales16 = block_scales16(srow + 4 * g, std::min<size_t>(16, kblocks - 4 * g), e8m0);
      const __m512 scale = _mm512_maskz_permutexvar_ps(kAll, spread[g % 4], scales16);
      // The short last group: its blocks' bytes only (codes 0 beyond meet zero activations; the
      // absent blocks' scales are 0 too).
      const __m512i packed = g < full ? _mm512_loadu_si512(wrow + g * 64)
                                      : _mm512_maskz_loadu_epi8((__mmask64{1} << (16 * (kblocks - 4 * g))) - 1,
                                                                wrow + g * 64);
      const auto lookup = [&](__m512i index) CEDAR_X86_BF16_TARGET {
        return reinterpret_cast<__m512bh>(_mm512_maskz_permutexvar_epi16(kAllWords, index, table));
      };
      const __m512bh w[4] = {lookup(packed), lookup(_mm512_maskz_srli_epi16(kAllWords, packed, 4)),
                             lookup(_mm512_maskz_srli_epi16(kAllWords, packed, 8)),
                             lookup(_mm512_maskz_srli_epi16(kAllWords, packed, 12))};
      for (size_t r = 0; r < R; ++r) {
        const uint16_t* a = plane + r * words + g * 128;
        const auto act = [a](size_t run) CEDAR_X86_BF16_TARGET {
          return reinterpret_cast<__m512bh>(_mm512_loadu_si512(a + 32 * run));
        };
        const __m512 sum01 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), w[0], act(0)), w[1], act(1));
        const __m512 sum23 = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), w[2], act(2)), w[3], act(3));
        acc[r][0] = _mm512_fmadd_ps(sum01, scale, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(sum23, scale, acc[r][1]);
      }
    }
    for (size_t r = 0; r < R; ++r)
      y[r * n_total + n] = round_bf16(sum_lanes_avx512(_mm512_add_ps(acc[r][0], acc[r][1])));
  }
}

#undef CEDAR_X86_BF16_TARGET

}  // namespace

bool fp4_gemv_bf16_usable() {
  return has_avx512_bf16() && g_bf16_allowed.load(std::memory_order_relaxed) &&
         (has_fast_avx512_bf16_dot() || g_bf16_forced.load(std::memory_order_relaxed));
}

bool fp4_bf16_pack_row(const float* values, size_t k, uint16_t* plane) {
  if (has_avx512_bf16()) return pack_row_avx512(values, k, plane);
  return fp4_bf16_pack_row_scalar(values, k, plane);
}

void fp4_gemv_bf16(const uint16_t* plane, size_t m, const uint8_t* wdata, const uint8_t* wscales, size_t n_total,
                   size_t k, float* y, size_t n_begin, size_t n_end) {
  switch (m) {
    case 4: return gemv_rows_bf16<4>(plane, wdata, wscales, n_total, k, y, n_begin, n_end);
    case 3: return gemv_rows_bf16<3>(plane, wdata, wscales, n_total, k, y, n_begin, n_end);
    case 2: return gemv_rows_bf16<2>(plane, wdata, wscales, n_total, k, y, n_begin, n_end);
    default: return gemv_rows_bf16<1>(plane, wdata, wscales, n_total, k, y, n_begin, n_end);
  }
}

void fp4_vnni_pack_block(const int32_t* p, size_t kb, int8_t* row_plane, int32_t* row_correction) {
  if (has_avx512_vnni()) return pack_block_avx512(p, kb, row_plane, row_correction);
  fp4_vnni_pack_block_scalar(p, kb, row_plane, row_correction);
}

bool fp4_gemv_vnni_usable() { return has_avx512_vnni() && g_allowed.load(std::memory_order_relaxed); }

void fp4_gemv_vnni(const Fp4GemvPlanes& planes, size_t m, const float* ascales, const uint8_t* wdata,
                   const uint8_t* wscales, size_t n_total, size_t k, float* y, size_t n_begin, size_t n_end) {
  switch (m) {
    case 4: return gemv_rows<4>(planes, ascales, wdata, wscales, n_total, k, y, n_begin, n_end);
    case 3: return gemv_rows<3>(planes, ascales, wdata, wscales, n_total, k, y, n_begin, n_end);
    case 2: return gemv_rows<2>(planes, ascales, wdata, wscales, n_total, k, y, n_begin, n_end);
    default: return gemv_rows<1>(planes, ascales, wdata, wscales, n_total, k, y, n_begin, n_end);
  }
}

#else  // not x86-64 with GCC or Clang

void fp4_vnni_pack_block(const int32_t* p, size_t kb, int8_t* row_plane, int32_t* row_correction) {
  fp4_vnni_pack_block_scalar(p, kb, row_plane, row_correction);
}
bool fp4_gemv_vnni_usable() { return false; }
bool fp4_gemv_bf16_usable() { return false; }
bool fp4_bf16_pack_row(const float* values, size_t k, uint16_t* plane) {
  return fp4_bf16_pack_row_scalar(values, k, plane);
}
void fp4_gemv_bf16(const uint16_t*, size_t, const uint8_t*, const uint8_t*, size_t, size_t, float*, size_t, size_t) {}
void fp4_gemv_vnni(const Fp4GemvPlanes&, size_t, const float*, const uint8_t*, const uint8_t*, size_t, size_t, float*,
                   size_t, size_t) {}

#endif

}  // namespace cedar::ops::x86
