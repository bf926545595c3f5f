// The AVX512-BF16 register tile of x86_gemm_bf16.h. Built with target attributes, so the file
// compiles for any x86-64 baseline and is only entered after the run-time check.
#include "ops/linear/x86_gemm_bf16.h"

#include <algorithm>
#include <atomic>

#include "ops/formats/formats.h"

#include "ops/simd/x86_features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CEDAR_GEMM_BF16_X86 1
#include "ops/linear/x86_fp4_block-inl.h"
#endif

namespace cedar::ops::x86 {
namespace {
std::atomic<bool> g_allowed{true};
}  // namespace

void set_gemm_bf16_allowed(bool allowed) { g_allowed.store(allowed, std::memory_order_relaxed); }

#ifdef CEDAR_GEMM_BF16_X86

namespace {

#define CEDAR_X86_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// Two accumulators per row (even and odd pairs): with one, six rows are six dependent chains, fewer
// than the instruction's latency times its throughput.
template <size_t MR>
CEDAR_X86_TARGET void tile(const uint32_t* act, size_t lda, const uint32_t* panel, size_t pairs, float* acc_out,
                           bool first) {
  __m512 even[MR], odd[MR];
  for (size_t r = 0; r < MR; ++r) {
    even[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc_out + r * 16);
    odd[r] = _mm512_setzero_ps();
  }
  size_t p = 0;
  for (; p + 2 <= pairs; p += 2) {
    const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(panel + p * 16));
    const __m512bh w1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(panel + (p + 1) * 16));
    for (size_t r = 0; r < MR; ++r) {
      even[r] = _mm512_dpbf16_ps(even[r], reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(act[r * lda + p]))), w0);
      odd[r] = _mm512_dpbf16_ps(odd[r], reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(act[r * lda + p + 1]))), w1);
    }
  }
  if (p < pairs) {
    const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(panel + p * 16));
    for (size_t r = 0; r < MR; ++r)
      even[r] = _mm512_dpbf16_ps(even[r], reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(act[r * lda + p]))), w0);
  }
  for (size_t r = 0; r < MR; ++r) _mm512_storeu_ps(acc_out + r * 16, _mm512_add_ps(even[r], odd[r]));
}

// The zero-masked forms with every lane set throughout: GCC 12's plain forms start from an
// undefined vector and trip -Wmaybe-uninitialized.
constexpr __mmask16 kAll16 = 0xFFFF;
constexpr __mmask8 kAll8 = 0xFF;

// r[c] (row c, 16 u32) -> r[p] (column p of the 16 rows): 32-bit, then 64-bit interleaves within the
// 128-bit lanes, then two rounds of 128-bit lane shuffles.
CEDAR_X86_TARGET inline void transpose16(__m512i* r) {
  __m512i t[16], u[16], v[16];
  for (size_t i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_epi32(kAll16, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(kAll16, r[i], r[i + 1]);
  }
  // u[4q + c]: rows 4q..4q+3 of columns c, 4 + c, 8 + c, 12 + c (one per 128-bit lane).
  for (size_t q = 0; q < 4; ++q) {
    const __m512i* tq = t + 4 * q;
    u[4 * q + 0] = _mm512_maskz_unpacklo_epi64(kAll8, tq[0], tq[2]);
    u[4 * q + 1] = _mm512_maskz_unpackhi_epi64(kAll8, tq[0], tq[2]);
    u[4 * q + 2] = _mm512_maskz_unpacklo_epi64(kAll8, tq[1], tq[3]);
    u[4 * q + 3] = _mm512_maskz_unpackhi_epi64(kAll8, tq[1], tq[3]);
  }
  // v[c] / v[4 + c]: rows 0-7 of columns c, 8 + c / 4 + c, 12 + c; v[8 + c] / v[12 + c]: rows 8-15.
  for (size_t c = 0; c < 4; ++c) {
    v[c] = _mm512_maskz_shuffle_i32x4(kAll16, u[c], u[4 + c], 0x88);
    v[4 + c] = _mm512_maskz_shuffle_i32x4(kAll16, u[c], u[4 + c], 0xDD);
    v[8 + c] = _mm512_maskz_shuffle_i32x4(kAll16, u[8 + c], u[12 + c], 0x88);
    v[12 + c] = _mm512_maskz_shuffle_i32x4(kAll16, u[8 + c], u[12 + c], 0xDD);
  }
  for (size_t c = 0; c < 4; ++c) {
    r[c] = _mm512_maskz_shuffle_i32x4(kAll16, v[c], v[8 + c], 0x88);
    r[8 + c] = _mm512_maskz_shuffle_i32x4(kAll16, v[c], v[8 + c], 0xDD);
    r[4 + c] = _mm512_maskz_shuffle_i32x4(kAll16, v[4 + c], v[12 + c], 0x88);
    r[12 + c] = _mm512_maskz_shuffle_i32x4(kAll16, v[4 + c], v[12 + c], 0xDD);
  }
}

CEDAR_X86_TARGET bool fp4_panel(const uint8_t* packed, size_t row_bytes, const uint8_t* scales, size_t scale_stride,
                                size_t nr, size_t n_blocks, uint32_t* panel, int* lo, int* hi) {
  const __m512i table = _mm512_load_si512(kE2m1Bf16Words.bits);
  int s_lo = 255, s_hi = 0;
  for (size_t b = 0; b < n_blocks; ++b) {
    __m512i r[16];
    for (size_t c = 0; c < 16; ++c) {
      if (c >= nr) {
        r[c] = _mm512_setzero_si512();
        continue;
      }
      const int s = scales[c * scale_stride + b];
      if (s < 2 || s > 252) return false;
      s_lo = std::min(s_lo, s);
      s_hi = std::max(s_hi, s);
      r[c] = fp4_block_bf16_pairs(packed + c * row_bytes + 16 * b, s, table);
    }
    transpose16(r);
    for (size_t p = 0; p < 16; ++p) _mm512_storeu_si512(panel + (16 * b + p) * 16, r[p]);
  }
  if (n_blocks > 0 && nr > 0) {
    *lo = std::min(*lo, s_lo - 1);
    *hi = std::max(*hi, s_hi + 2);
  }
  return true;
}

#define CEDAR_X86_VBMI_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16,avx512vbmi")))

CEDAR_X86_VBMI_TARGET bool fp8_panel(const uint8_t* codes, size_t row_bytes, const uint8_t* scales, size_t nr,
                                     size_t n_blocks, uint32_t* panel, int* lo, int* hi) {
  const E4m3Bf16Bytes& tables = e4m3_bf16_bytes();
  int s_lo = 255, s_hi = 0;
  for (size_t b = 0; b < n_blocks; ++b) {
    const int s = scales[b];
    if (s < 10 || s > 246) return false;
    s_lo = std::min(s_lo, s);
    s_hi = std::max(s_hi, s);
  }
  const __m512i high0 = _mm512_load_si512(tables.high), high1 = _mm512_load_si512(tables.high + 64);
  const __m512i low0 = _mm512_load_si512(tables.low), low1 = _mm512_load_si512(tables.low + 64);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i nan_code = _mm512_set1_epi8(0x7F);
  const __m512i magnitude = _mm512_set1_epi16(0x7FFF);
  // Pairs 0-15 and 16-31 of a 64-code chunk from the byte unpacks' lane order (lane L of the low
  // unpack holds pairs 8L..8L+3, of the high unpack 8L+4..8L+7).
  const __m512i first_half = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i second_half = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  for (size_t b = 0; b < n_blocks; b += 2) {
    const bool two = b + 1 < n_blocks;
    const __m512i delta0 = _mm512_set1_epi16(static_cast<short>((scales[b] - 127) << 7));
    const __m512i delta1 = two ? _mm512_set1_epi16(static_cast<short>((scales[b + 1] - 127) << 7)) : delta0;
    __m512i r0[16], r1[16];
    for (size_t c = 0; c < 16; ++c) {
      if (c >= nr) {
        r0[c] = r1[c] = _mm512_setzero_si512();
        continue;
      }
      const uint8_t* src = codes + c * row_bytes + 32 * b;
      const __m512i code = two ? _mm512_loadu_si512(src) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, src);
      if (_mm512_cmpeq_epi8_mask(_mm512_and_si512(code, nan_code), nan_code) != 0) return false;
      // vpermi2b reads the low 7 bits of each index byte: the magnitude; the sign comes from bit 7.
      const __m512i high = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high0, code, high1), code, sign, 0xF8);
      const __m512i low = _mm512_permutex2var_epi8(low0, code, low1);
      const __m512i lo_unpack = _mm512_unpacklo_epi8(low, high), hi_unpack = _mm512_unpackhi_epi8(low, high);
      __m512i p0 = _mm512_permutex2var_epi64(lo_unpack, first_half, hi_unpack);
      __m512i p1 = _mm512_permutex2var_epi64(lo_unpack, second_half, hi_unpack);
      p0 = _mm512_mask_add_epi16(p0, _mm512_test_epi16_mask(p0, magnitude), p0, delta0);
      p1 = _mm512_mask_add_epi16(p1, _mm512_test_epi16_mask(p1, magnitude), p1, delta1);
      r0[c] = p0;
      r1[c] = p1;
    }
    transpose16(r0);
    for (size_t p = 0; p < 16; ++p) _mm512_storeu_si512(panel + (16 * b + p) * 16, r0[p]);
    if (two) {
      transpose16(r1);
      for (size_t p = 0; p < 16; ++p) _mm512_storeu_si512(panel + (16 * (b + 1) + p) * 16, r1[p]);
    }
  }
  if (n_blocks > 0 && nr > 0) {
    *lo = std::min(*lo, s_lo - 9);
    *hi = std::max(*hi, s_hi + 8);
  }
  return true;
}

#undef CEDAR_X86_VBMI_TARGET
#undef CEDAR_X86_TARGET

}  // namespace

bool fp8_panel_bf16_pairs(const uint8_t* codes, size_t row_bytes, const uint8_t* scales, size_t nr, size_t n_blocks,
                          uint32_t* panel, int* lo, int* hi) {
  if (!has_avx512_bf16_vbmi()) return false;
  return fp8_panel(codes, row_bytes, scales, nr, n_blocks, panel, lo, hi);
}

bool fp4_panel_bf16_pairs(const uint8_t* packed, size_t row_bytes, const uint8_t* scales, size_t scale_stride,
                          size_t nr, size_t n_blocks, uint32_t* panel, int* lo, int* hi) {
  return fp4_panel(packed, row_bytes, scales, scale_stride, nr, n_blocks, panel, lo, hi);
}

bool gemm_bf16_usable() { return has_avx512_bf16() && g_allowed.load(std::memory_order_relaxed); }

void panel_tile_bf16(size_t mr, const uint32_t* act_pairs, size_t lda_pairs, const uint32_t* panel_pairs,
                     size_t pairs, float* acc, bool first) {
  switch (mr) {
    case 6: return tile<6>(act_pairs, lda_pairs, panel_pairs, pairs, acc, first);
    case 5: return tile<5>(act_pairs, lda_pairs, panel_pairs, pairs, acc, first);
    case 4: return tile<4>(act_pairs, lda_pairs, panel_pairs, pairs, acc, first);
    case 3: return tile<3>(act_pairs, lda_pairs, panel_pairs, pairs, acc, first);
    case 2: return tile<2>(act_pairs, lda_pairs, panel_pairs, pairs, acc, first);
    default: return tile<1>(act_pairs, lda_pairs, panel_pairs, pairs, acc, first);
  }
}

#else  // not x86-64 with GCC or Clang

bool gemm_bf16_usable() { return false; }
void panel_tile_bf16(size_t, const uint32_t*, size_t, const uint32_t*, size_t, float*, bool) {}
bool fp4_panel_bf16_pairs(const uint8_t*, size_t, const uint8_t*, size_t, size_t, size_t, uint32_t*, int*, int*) {
  return false;
}
bool fp8_panel_bf16_pairs(const uint8_t*, size_t, const uint8_t*, size_t, size_t, uint32_t*, int*, int*) {
  return false;
}

#endif

}  // namespace cedar::ops::x86
