// The AVX512-VBMI + AVX512-BF16 FP8 GEMV of x86_fp8_gemv.h. The functions that use the extensions carry
// them as target attributes, so this file builds for any x86-64 baseline and is only entered after the
// run-time check.
#include "ops/linear/x86_fp8_gemv.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/formats/formats.h"
#include "ops/simd/prefetch.h"
#include "ops/simd/x86_features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CEDAR_FP8_GEMV_X86 1
#include "ops/simd/x86_lane_sum.h"
#endif

namespace cedar::ops::x86 {
namespace {
std::atomic<bool> g_allowed{true};
}  // namespace

void set_fp8_gemv_bf16_allowed(bool allowed) { g_allowed.store(allowed, std::memory_order_relaxed); }

#ifdef CEDAR_FP8_GEMV_X86

namespace {

constexpr size_t kChunk = 64;  // codes per step (one cache line, one zmm)

#define CEDAR_X86_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16")))

// What the activations' magnitudes span, for the per-group checks.
struct ActivationRange {
  float min_nonzero = 0.0f;  // 0 when all are zero
  float max = 0.0f;
};

// The activations [m, k] in the order the decoded weights come out (group_rows), as f32: per 64-element
// chunk, the even elements 0, 2, .., 30, then 32, 34, .., 62, then the odd ones 1, 3, .., 31 and 33, 35,
// .., 63 (a chunk of 32 fills the second and fourth sixteen with zeros). Each sixteen lies in one
// 32-element scale block. Returns false when a value is not a bf16 value or not finite.
CEDAR_X86_TARGET bool order_activations(const float* act, size_t m, size_t k, float* out, ActivationRange& range) {
  const size_t chunks = (k + kChunk - 1) / kChunk;
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF), one = _mm512_set1_epi32(1);
  __m512i low_bits = _mm512_setzero_si512();
  __m512i max_mag = _mm512_setzero_si512();
  __m512i min_mag_less_one = _mm512_set1_epi32(-1);  // magnitude - 1 wraps for zero, so zeros never win
  for (size_t r = 0; r < m; ++r) {
    for (size_t c = 0; c < chunks; ++c) {
      const float* x = act + r * k + c * kChunk;
      const bool full = (c + 1) * kChunk <= k;
      __m512 v[4];
      for (size_t i = 0; i < 4; ++i) v[i] = full || i < 2 ? _mm512_loadu_ps(x + 16 * i) : _mm512_setzero_ps();
      for (const __m512 xv : v) {
        const __m512i bits = _mm512_castps_si512(xv);
        const __m512i mag = _mm512_and_si512(bits, magnitude);
        low_bits = _mm512_or_si512(low_bits, bits);
        // The masked forms with a full mask: GCC 12's plain ones start from an undefined vector and trip
        // -Wmaybe-uninitialized.
        max_mag = _mm512_mask_max_epu32(max_mag, 0xFFFF, max_mag, mag);
        const __m512i mag_less_one = _mm512_sub_epi32(mag, one);
        min_mag_less_one = _mm512_mask_min_epu32(min_mag_less_one, 0xFFFF, min_mag_less_one, mag_less_one);
      }
      float* o = out + (r * chunks + c) * kChunk;
      _mm512_storeu_ps(o, _mm512_permutex2var_ps(v[0], even, v[1]));
      _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(v[2], even, v[3]));
      _mm512_storeu_ps(o + 32, _mm512_permutex2var_ps(v[0], odd, v[1]));
      _mm512_storeu_ps(o + 48, _mm512_permutex2var_ps(v[2], odd, v[3]));
    }
  }
  // Lanes through memory (once per call): GCC 12's reduce intrinsics trip the same warning.
  alignas(64) uint32_t lanes[3][16];
  _mm512_store_si512(lanes[0], low_bits);
  _mm512_store_si512(lanes[1], max_mag);
  _mm512_store_si512(lanes[2], min_mag_less_one);
  uint32_t low = 0, max_bits = 0, min_less_one = ~0u;
  for (size_t i = 0; i < 16; ++i) {
    low |= lanes[0][i];
    max_bits = std::max(max_bits, lanes[1][i]);
    min_less_one = std::min(min_less_one, lanes[2][i]);
  }
  const uint32_t min_bits = min_less_one + 1u;  // 0: all zero
  if ((low & 0xFFFF) != 0 || max_bits >= 0x7F800000u) return false;
  std::memcpy(&range.max, &max_bits, 4);
  std::memcpy(&range.min_nonzero, &min_bits, 4);
  return true;
}

// Whether every product of a group's scaled activations stays exact and in range on both decodes
// (group_rows): each nonzero |activation · scale| in [2^-117, 256), so that its products with nonzero
// E4M3 weights (>= 2^-9) are normal f32 numbers, and times 2^120 it is a bf16 number. Checked on the
// extremes of both factors, so a group can be declined that a value-by-value check would take.
bool group_qualifies(const ActivationRange& range, const uint8_t* group_scales, size_t kblocks) {
  const auto [lo, hi] = std::minmax_element(group_scales, group_scales + kblocks);
  const double smallest = static_cast<double>(range.min_nonzero) * std::ldexp(1.0, *lo - 127);
  const double largest = static_cast<double>(range.max) * std::ldexp(1.0, *hi - 127);
  return (range.min_nonzero == 0.0f || smallest >= 0x1p-117) && largest < 256.0;
}

// One group's activations (ordered as above) times its scales, as bf16, twice: as they are (`plain`,
// for chunks decoded through the tables) and times 2^120 (`fast`, for the arithmetic decode). Exact:
// the scales are powers of two and group_qualifies held.
CEDAR_X86_TARGET void scale_group(const float* ordered, size_t m, size_t k, const uint8_t* group_scales,
                                  uint16_t* plain, uint16_t* fast) {
  const float* e8m0 = e8m0_table();
  const size_t chunks = (k + kChunk - 1) / kChunk;
  const __m512 bias = _mm512_set1_ps(0x1p120f);
  for (size_t r = 0; r < m; ++r) {
    for (size_t c = 0; c < chunks; ++c) {
      const size_t kb = 2 * c;
      const bool full = (c + 1) * kChunk <= k;
      const __m512 s0 = _mm512_set1_ps(e8m0[group_scales[kb]]);
      const __m512 s1 = full ? _mm512_set1_ps(e8m0[group_scales[kb + 1]]) : _mm512_setzero_ps();
      const size_t at = (r * chunks + c) * kChunk;
      const float* x = ordered + at;
      const __m512 v0 = _mm512_mul_ps(_mm512_loadu_ps(x), s0), v1 = _mm512_mul_ps(_mm512_loadu_ps(x + 16), s1);
      const __m512 v2 = _mm512_mul_ps(_mm512_loadu_ps(x + 32), s0), v3 = _mm512_mul_ps(_mm512_loadu_ps(x + 48), s1);
      _mm512_storeu_si512(plain + at, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v1, v0)));
      _mm512_storeu_si512(plain + at + 32, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v3, v2)));
      _mm512_storeu_si512(fast + at, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_mul_ps(v1, bias),
                                                                                   _mm512_mul_ps(v0, bias))));
      _mm512_storeu_si512(fast + at + 32, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_mul_ps(v3, bias),
                                                                                        _mm512_mul_ps(v2, bias))));
    }
  }
}

// Weight rows [n_begin, n_end) of one group against its prescaled activations, R rows of them.
//
// The decode of a 64-code chunk, as 32 words of its even codes and 32 of its odd ones:
//   * arithmetically: in a 16-bit word holding a code in its high byte, an arithmetic shift right by 4
//     and a mask (0x87F0) leave the sign in bit 15 and the 7 magnitude bits (4 exponent, 3 mantissa)
//     in bits 4-10: the bf16 bits of the value times 2^-120 (bf16's exponent bias is 127, E4M3's 7),
//     which the `fast` activations (times 2^120) undo exactly. The odd codes already sit in the high
//     bytes of the chunk's words; the even ones do in the words of the same line loaded a byte earlier.
//     Two shifts and two masks, where table lookups take the shuffle port that vdpbf16ps also needs.
//     That is exact for zero and the normal codes: E4M3 subnormals (exponent field 0, mantissa not)
//     would be bf16 subnormals, which vdpbf16ps reads as zero. So a chunk with a code whose exponent field is 0
//     (one bit test on the codes) and which is not zero (a second test, in that rare branch: zero
//     comes out as ±0 here) takes the second way. Trained weights rarely have such codes (0.7 % of
//     cedar-mini's chunks have a zero or subnormal one). The NaN codes 0x7F and 0xFF, which no
//     checkpoint holds, come out as ±480 here, as in the Highway decoders (NaN in a table chunk).
//   * through the tables, exactly for every code: two `vpermi2b` give the high and low bytes of the
//     bf16 bits (subnormal codes included: they are normal bf16 numbers), the sign is ORed in, and
//     word shifts join the bytes in the same order; those words meet the `plain` activations.
template <size_t R>
CEDAR_X86_TARGET void group_rows(const uint16_t* plain, const uint16_t* fast, const uint8_t* codes, size_t n_total,
                                 size_t k, float* y, size_t n_begin, size_t n_end) {
  const E4m3Bf16Bytes& t = e4m3_bf16_bytes();
  const __m512i high0 = _mm512_load_si512(t.high), high1 = _mm512_load_si512(t.high + 64);
  const __m512i low0 = _mm512_load_si512(t.low), low1 = _mm512_load_si512(t.low + 64);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i low_bytes = _mm512_set1_epi16(0x00FF), high_bytes = _mm512_set1_epi16(static_cast<short>(0xFF00));
  const __m512i bf16_bits = _mm512_set1_epi16(static_cast<short>(0x87F0));
  const __m512i exponent_field = _mm512_set1_epi8(0x78), mantissa_field = _mm512_set1_epi8(0x07);
  const size_t chunks = (k + kChunk - 1) / kChunk;
  const size_t full = k / kChunk;
  constexpr size_t C = R == 1 ? 8 : (R == 2 ? 4 : 2);  // fp32 chains per activation row (latency of vdpbf16ps)
  for (size_t n = n_begin; n < n_end; ++n) {
    const uint8_t* row = codes + n * k;
    __m512 acc[R][C];
    for (size_t r = 0; r < R; ++r)
      for (size_t j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_ps();
    // One 64-code chunk into chains j and j + 1 (j a constant after inlining: the chains stay in registers),
    // given its codes, the same line loaded a byte earlier and which of its codes the arithmetic decode
    // cannot take.
    const auto dot = [&](size_t c, size_t j, __m512i code, __m512i code_earlier, __mmask64 special)
                         CEDAR_X86_TARGET {
      __m512i w0, w1;
      const uint16_t* a;
      // Zero codes (exponent and mantissa fields 0) decode to ±0 arithmetically too: only a chunk with a
      // subnormal code needs the tables.
      if (__builtin_expect(special != 0, 0) && _mm512_mask_test_epi8_mask(special, code, mantissa_field) != 0) {
        // vpermi2b reads the low 7 bits of each index byte: the magnitude; the sign comes from bit 7.
        const __m512i high = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high0, code, high1), code, sign, 0xF8);
        const __m512i low = _mm512_permutex2var_epi8(low0, code, low1);
        w0 = _mm512_ternarylogic_epi32(_mm512_slli_epi16(high, 8), low, low_bytes, 0xF8);
        w1 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(low, 8), high, high_bytes, 0xF8);
        a = plain + c * kChunk;
      } else {
        w0 = _mm512_and_si512(_mm512_srai_epi16(code_earlier, 4), bf16_bits);
        w1 = _mm512_and_si512(_mm512_srai_epi16(code, 4), bf16_bits);
        a = fast + c * kChunk;
      }
      for (size_t r = 0; r < R; ++r) {
        const uint16_t* ar = a + r * chunks * kChunk;
        acc[r][j] = _mm512_dpbf16_ps(acc[r][j], reinterpret_cast<__m512bh>(w0),
                                     reinterpret_cast<__m512bh>(_mm512_loadu_si512(ar)));
        acc[r][j + 1] = _mm512_dpbf16_ps(acc[r][j + 1], reinterpret_cast<__m512bh>(w1),
                                         reinterpret_cast<__m512bh>(_mm512_loadu_si512(ar + 32)));
      }
    };
    // A whole chunk after the row's first.
    const auto step = [&](size_t c, size_t j) CEDAR_X86_TARGET {
      const uint8_t* line = row + c * kChunk;
      prefetch_weight_stream(line);
      const __m512i code = _mm512_loadu_si512(line);
      dot(c, j, code, _mm512_loadu_si512(line - 1), _mm512_testn_epi8_mask(code, exponent_field));
    };
    // The row's first chunk, whose earlier load skips the byte before it (before the matrix's first row,
    // nothing is), and a chunk of 32 codes (the last one when k is an odd multiple of 32), whose loads
    // give zeros past them.
    const auto edge_step = [&](size_t c, size_t j) CEDAR_X86_TARGET {
      const uint8_t* line = row + c * kChunk;
      prefetch_weight_stream(line);
      const __mmask64 valid = c < full ? ~0ull : 0xFFFFFFFFull;
      const __m512i code = _mm512_maskz_loadu_epi8(valid, line);
      const __m512i code_earlier = _mm512_maskz_loadu_epi8(
          c == 0 ? valid & ~1ull : valid, reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(line) - 1));
      dot(c, j, code, code_earlier, _mm512_mask_testn_epi8_mask(valid, code, exponent_field));
    };
    edge_step(0, 0);
    size_t c = 1;
    if constexpr (C == 8) {
      for (; c + 4 <= full; c += 4) {
        step(c, 0);
        step(c + 1, 2);
        step(c + 2, 4);
        step(c + 3, 6);
      }
    } else if constexpr (C == 4) {
      for (; c + 2 <= full; c += 2) {
        step(c, 0);
        step(c + 1, 2);
      }
    }
    for (; c < full; ++c) step(c, 0);
    if (c < chunks) edge_step(c, 0);
    for (size_t r = 0; r < R; ++r) {
      __m512 sum = acc[r][0];
      for (size_t j = 1; j < C; ++j) sum = _mm512_add_ps(sum, acc[r][j]);
      y[r * n_total + n] = round_bf16(sum_lanes_avx512(sum));
    }
  }
}

#undef CEDAR_X86_TARGET

}  // namespace

bool fp8_gemv_bf16_usable() { return has_avx512_bf16_vbmi() && g_allowed.load(std::memory_order_relaxed); }

size_t fp8_gemv_bf16(const float* act, size_t m, const uint8_t* codes, const uint8_t* scales, size_t n_total,
                     size_t k, float* y, size_t n_begin, size_t n_end) {
  const size_t kblocks = k / 32;
  const size_t chunks = (k + kChunk - 1) / kChunk;
  // Grow to the largest shape, then reused.
  thread_local std::vector<float> ordered;     // [m, chunks, 64]
  thread_local std::vector<uint16_t> scaled;   // plain then fast, each [m, chunks, 64]
  const size_t each = m * chunks * kChunk;
  if (ordered.size() < each) {
    ordered.resize(each);
    scaled.resize(2 * each);
  }
  ActivationRange range;
  if (!order_activations(act, m, k, ordered.data(), range)) return n_begin;
  for (size_t n = n_begin; n < n_end;) {
    const size_t group = n / 32;
    const size_t end = std::min(n_end, (group + 1) * 32);
    const uint8_t* group_scales = scales + group * kblocks;
    if (!group_qualifies(range, group_scales, kblocks)) return n;
    uint16_t* plain = scaled.data();
    uint16_t* fast = scaled.data() + each;
    scale_group(ordered.data(), m, k, group_scales, plain, fast);
    switch (m) {
      case 4: group_rows<4>(plain, fast, codes, n_total, k, y, n, end); break;
      case 3: group_rows<3>(plain, fast, codes, n_total, k, y, n, end); break;
      case 2: group_rows<2>(plain, fast, codes, n_total, k, y, n, end); break;
      default: group_rows<1>(plain, fast, codes, n_total, k, y, n, end); break;
    }
    n = end;
  }
  return n_end;
}

#else  // not x86-64 with GCC or Clang

bool fp8_gemv_bf16_usable() { return false; }
size_t fp8_gemv_bf16(const float*, size_t, const uint8_t*, const uint8_t*, size_t, size_t, float*, size_t n_begin,
                     size_t) {
  return n_begin;
}

#endif

}  // namespace cedar::ops::x86
