// The AVX512-BF16 bf16 GEMV of bf16_gemv_x86.h. The function that uses the extension carries it as a
// target attribute, so this file builds for any x86-64 baseline and is only entered after the run-time
// check.
#include "ops/bf16_gemv_x86.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "ops/formats.h"
#include "ops/prefetch.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CEDAR_BF16_GEMV_X86 1
#include "ops/x86_lane_sum.h"
#endif

namespace cedar::ops::x86 {
namespace {
std::atomic<bool> g_allowed{true};
}  // namespace

void set_bf16_gemv_dot_allowed(bool allowed) { g_allowed.store(allowed, std::memory_order_relaxed); }

#ifdef CEDAR_BF16_GEMV_X86

namespace {

bool cpu_has_extensions() {
  // libgcc's check also asks the OS (XCR0) whether it saves the AVX-512 state.
  static const bool has =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
  return has;
}

constexpr size_t kPair = 32;  // bf16 values per zmm (one 64-byte line of weights)

#define CEDAR_X86_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// Weight rows [n_begin, n_end) against R rows of bf16 activations (`xb`, [R, k]).
template <size_t R>
CEDAR_X86_TARGET void gemv_rows(const uint16_t* xb, size_t k, const uint16_t* w, size_t n_total, float* y,
                                bool bf16_out, size_t n_begin, size_t n_end) {
  constexpr size_t C = R == 1 ? 8 : (R == 2 ? 4 : 2);  // fp32 chains per activation row (latency of vdpbf16ps)
  const size_t steps = (k + kPair - 1) / kPair, full = k / kPair;
  const __mmask32 tail = static_cast<__mmask32>((1ull << (k % kPair)) - 1);
  for (size_t n = n_begin; n < n_end; ++n) {
    const uint16_t* row = w + n * k;
    __m512 acc[R][C];
    for (size_t r = 0; r < R; ++r)
      for (size_t j = 0; j < C; ++j) acc[r][j] = _mm512_setzero_ps();
    // 32 weights into chain j (a constant after inlining: the chains stay in registers).
    const auto step = [&](size_t s, size_t j) CEDAR_X86_TARGET {
      prefetch_weight_stream(row + s * kPair);
      const bool whole = s < full;
      const __m512bh wv = reinterpret_cast<__m512bh>(whole ? _mm512_loadu_si512(row + s * kPair)
                                                            : _mm512_maskz_loadu_epi16(tail, row + s * kPair));
      for (size_t r = 0; r < R; ++r) {
        const uint16_t* a = xb + r * k + s * kPair;
        const __m512i av = whole ? _mm512_loadu_si512(a) : _mm512_maskz_loadu_epi16(tail, a);
        acc[r][j] = _mm512_dpbf16_ps(acc[r][j], wv, reinterpret_cast<__m512bh>(av));
      }
    };
    size_t s = 0;
    for (; s + C <= steps; s += C)
      for (size_t j = 0; j < C; ++j) step(s + j, j);
    for (; s < steps; ++s) step(s, 0);
    for (size_t r = 0; r < R; ++r) {
      __m512 sum = acc[r][0];
      for (size_t j = 1; j < C; ++j) sum = _mm512_add_ps(sum, acc[r][j]);
      const float v = sum_lanes_avx512(sum);
      y[r * n_total + n] = bf16_out ? round_bf16(v) : v;
    }
  }
}

#undef CEDAR_X86_TARGET

}  // namespace

bool bf16_gemv_dot_usable() { return cpu_has_extensions() && g_allowed.load(std::memory_order_relaxed); }

bool bf16_gemv_dot(const float* x, size_t m, size_t k, const uint16_t* w, size_t n_total, float* y, bool bf16_out,
                   size_t n_begin, size_t n_end) {
  thread_local std::vector<uint16_t> xb;  // [m, k] bf16 bits; grows to the largest shape, then reused
  if (xb.size() < m * k) xb.resize(m * k);
  for (size_t i = 0; i < m * k; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    if (bits & 0xFFFFu) return false;  // not a bf16 value: the product would not be exact
    xb[i] = static_cast<uint16_t>(bits >> 16);
  }
  switch (m) {
    case 4: gemv_rows<4>(xb.data(), k, w, n_total, y, bf16_out, n_begin, n_end); break;
    case 3: gemv_rows<3>(xb.data(), k, w, n_total, y, bf16_out, n_begin, n_end); break;
    case 2: gemv_rows<2>(xb.data(), k, w, n_total, y, bf16_out, n_begin, n_end); break;
    default: gemv_rows<1>(xb.data(), k, w, n_total, y, bf16_out, n_begin, n_end); break;
  }
  return true;
}

#else  // not x86-64 with GCC or Clang

bool bf16_gemv_dot_usable() { return false; }
bool bf16_gemv_dot(const float*, size_t, size_t, const uint16_t*, size_t, float*, bool, size_t, size_t) { return false; }

#endif

}  // namespace cedar::ops::x86
