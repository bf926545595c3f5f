// The AVX512-BF16 register tile of gemm_bf16_x86.h. Built with target attributes, so the file
// compiles for any x86-64 baseline and is only entered after the run-time check.
#include "ops/gemm_bf16_x86.h"

#include <atomic>

#include "ops/x86_features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CEDAR_GEMM_BF16_X86 1
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

#undef CEDAR_X86_TARGET

}  // namespace

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

#endif

}  // namespace cedar::ops::x86
