// The AVX512-VBMI + AVX512-BF16 FP8 GEMV of fp8_gemv_x86.h. The functions that use the extensions carry
// them as target attributes, so this file builds for any x86-64 baseline and is only entered after the
// run-time check.
#include "ops/fp8_gemv_x86.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include "ops/formats.h"
#include "ops/prefetch.h"

#include "ops/x86_features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CEDAR_FP8_GEMV_X86 1
#include "ops/x86_lane_sum.h"
#endif

namespace cedar::ops::x86 {
namespace {
std::atomic<bool> g_allowed{true};
}  // namespace

void set_fp8_gemv_bf16_allowed(bool allowed) { g_allowed.store(allowed, std::memory_order_relaxed); }

#ifdef CEDAR_FP8_GEMV_X86

namespace {

constexpr size_t kChunk = 64;                // codes per step (one cache line, one zmm)
constexpr uint32_t kMinActBits = 0x05000000;  // f32 bits of 2^-117

#define CEDAR_X86_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16")))

// The scaled activations of one 32-row weight group, as bf16 in the order the decoded weights come out
// of the byte unpacks: per 64-element chunk, first elements 0-7, 16-23, 32-39, 48-55 (the even 8s of
// each 128-bit lane), then 8-15, 24-31, 40-47, 56-63. Returns false when a value does not qualify.
CEDAR_X86_TARGET bool prescale_group(const float* act, size_t m, size_t k, const uint8_t* group_scales,
                                     uint16_t* out) {
  const float* e8m0 = e8m0_table();
  const size_t chunks = (k + kChunk - 1) / kChunk;
  const __m512i first = _mm512_set_epi16(55, 54, 53, 52, 51, 50, 49, 48, 39, 38, 37, 36, 35, 34, 33, 32, 23, 22, 21,
                                         20, 19, 18, 17, 16, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(8));
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i below_min = _mm512_set1_epi32(static_cast<int>(kMinActBits - 1));
  const __m512i one = _mm512_set1_epi32(1);
  __mmask16 bad = 0;
  for (size_t r = 0; r < m; ++r) {
    const float* row = act + r * k;
    for (size_t c = 0; c < chunks; ++c) {
      const size_t kb = 2 * c;
      const bool full = (c + 1) * kChunk <= k;  // else only the first 32 elements exist
      const __m512 s0 = _mm512_set1_ps(e8m0[group_scales[kb]]);
      const __m512 s1 = full ? _mm512_set1_ps(e8m0[group_scales[kb + 1]]) : _mm512_setzero_ps();
      __m512 v[4];
      v[0] = _mm512_mul_ps(_mm512_loadu_ps(row + c * kChunk), s0);
      v[1] = _mm512_mul_ps(_mm512_loadu_ps(row + c * kChunk + 16), s0);
      v[2] = full ? _mm512_mul_ps(_mm512_loadu_ps(row + c * kChunk + 32), s1) : _mm512_setzero_ps();
      v[3] = full ? _mm512_mul_ps(_mm512_loadu_ps(row + c * kChunk + 48), s1) : _mm512_setzero_ps();
      for (const __m512 x : v) {
        const __m512i bits = _mm512_castps_si512(x);
        const __m512i mag = _mm512_and_si512(bits, magnitude);
        // Not a bf16 value, or nonzero below 2^-117 (mag - 1 wraps for zero).
        bad |= _mm512_test_epi32_mask(bits, low16);
        bad |= _mm512_cmplt_epu32_mask(_mm512_sub_epi32(mag, one), below_min);
      }
      const __m512i b01 = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v[1], v[0]));  // elements 0-31
      const __m512i b23 = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(v[3], v[2]));  // elements 32-63
      uint16_t* dst = out + (r * chunks + c) * kChunk;
      _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(b01, first, b23));
      _mm512_storeu_si512(dst + 32, _mm512_permutex2var_epi16(b01, second, b23));
    }
  }
  return bad == 0;
}

// Weight rows [n_begin, n_end) of one group against its prescaled activations, R rows of them.
template <size_t R>
CEDAR_X86_TARGET void group_rows(const uint16_t* prescaled, const uint8_t* codes, size_t n_total, size_t k, float* y,
                                 size_t n_begin, size_t n_end) {
  const E4m3Bf16Bytes& t = e4m3_bf16_bytes();
  const __m512i high0 = _mm512_load_si512(t.high), high1 = _mm512_load_si512(t.high + 64);
  const __m512i low0 = _mm512_load_si512(t.low), low1 = _mm512_load_si512(t.low + 64);
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  const size_t chunks = (k + kChunk - 1) / kChunk;
  const size_t full = k / kChunk;
  constexpr size_t C = R == 1 ? 8 : (R == 2 ? 4 : 2);  // fp32 chains per activation row (latency of vdpbf16ps)
  for (size_t n = n_begin; n < n_end; ++n) {
    const uint8_t* row = codes + n * k;
    __m512 acc[R][C];
    for (size_t r = 0; r < R; ++r)
      for (size_t j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_ps();
    // One 64-code chunk into chains j and j + 1 (j a constant after inlining: the chains stay in registers).
    const auto step = [&](size_t c, size_t j) CEDAR_X86_TARGET {
      prefetch_weight_stream(row + c * kChunk);
      const __m512i code = c < full ? _mm512_loadu_si512(row + c * kChunk)
                                    : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, row + c * kChunk);  // 32 left
      // vpermi2b reads the low 7 bits of each index byte: the magnitude; the sign comes from bit 7.
      const __m512i high = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high0, code, high1), code, sign, 0xF8);
      const __m512i low = _mm512_permutex2var_epi8(low0, code, low1);
      const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi8(low, high));
      const __m512bh w1 = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi8(low, high));
      for (size_t r = 0; r < R; ++r) {
        const uint16_t* a = prescaled + (r * chunks + c) * kChunk;
        acc[r][j] = _mm512_dpbf16_ps(acc[r][j], w0, reinterpret_cast<__m512bh>(_mm512_loadu_si512(a)));
        acc[r][j + 1] = _mm512_dpbf16_ps(acc[r][j + 1], w1, reinterpret_cast<__m512bh>(_mm512_loadu_si512(a + 32)));
      }
    };
    size_t c = 0;
    if constexpr (C == 8) {
      for (; c + 4 <= chunks; c += 4) {
        step(c, 0);
        step(c + 1, 2);
        step(c + 2, 4);
        step(c + 3, 6);
      }
    } else if constexpr (C == 4) {
      for (; c + 2 <= chunks; c += 2) {
        step(c, 0);
        step(c + 1, 2);
      }
    }
    for (; c < chunks; ++c) step(c, 0);
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
  thread_local std::vector<uint16_t> prescaled;  // [m, chunks, 64]; grows to the largest shape, then reused
  if (prescaled.size() < m * chunks * kChunk) prescaled.resize(m * chunks * kChunk);
  for (size_t n = n_begin; n < n_end;) {
    const size_t group = n / 32;
    const size_t end = std::min(n_end, (group + 1) * 32);
    if (!prescale_group(act, m, k, scales + group * kblocks, prescaled.data())) return n;
    switch (m) {
      case 4: group_rows<4>(prescaled.data(), codes, n_total, k, y, n, end); break;
      case 3: group_rows<3>(prescaled.data(), codes, n_total, k, y, n, end); break;
      case 2: group_rows<2>(prescaled.data(), codes, n_total, k, y, n, end); break;
      default: group_rows<1>(prescaled.data(), codes, n_total, k, y, n, end); break;
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
