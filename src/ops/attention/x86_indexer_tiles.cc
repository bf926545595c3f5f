// The AVX512-VNNI tile kernel of x86_indexer_tiles.h. Built with target attributes, so the file
// compiles for any x86-64 baseline and is only entered after the run-time check.
#include "ops/attention/x86_indexer_tiles.h"

#include <atomic>
#include <cstring>

#include "ops/attention/attention.h"
#include "ops/simd/x86_features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CEDAR_INDEXER_TILES_X86 1
#endif

namespace cedar::ops::x86 {
namespace {
std::atomic<bool> g_allowed{true};
}  // namespace

void set_indexer_tiles_vnni_allowed(bool allowed) { g_allowed.store(allowed, std::memory_order_relaxed); }

#ifdef CEDAR_INDEXER_TILES_X86

bool indexer_tiles_vnni_usable() { return has_avx512_vnni() && g_allowed.load(std::memory_order_relaxed); }

// Blocks outside, heads inside: a block's 8 code vectors stay in registers while every head's query
// codes meet them, so each dot product reads only its broadcast query codes. The heads' float64
// sums wait in `acc` between blocks (16 KiB at most, in L1).
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"))) void indexer_tile_dots_vnni(
    const uint8_t* tile_codes, const double* tile_scales, size_t head_dim, const int8_t* q_codes,
    const double* q_scale, const int16_t* q_offset, size_t n_heads, float* dots) {
  constexpr size_t kTile = kIndexKeyTile;
  static_assert(kTile == 16, "a tile's 16 keys are one zmm of int32 lanes");
  const size_t blocks = head_dim / 32;
  alignas(64) double acc[kIndexerTileMaxHeads * kTile];
  for (size_t b = 0; b < blocks; ++b) {
    __m512i codes[8];
    for (size_t quad = 0; quad < 8; ++quad) codes[quad] = _mm512_loadu_si512(tile_codes + (b * 8 + quad) * 4 * kTile);
    const __m512d key_scale_lo = _mm512_loadu_pd(tile_scales + b * kTile);
    const __m512d key_scale_hi = _mm512_loadu_pd(tile_scales + b * kTile + 8);
    for (size_t h = 0; h < n_heads; ++h) {
      const int8_t* q = q_codes + h * head_dim + b * 32;
      // A quad's four query codes as one int32, broadcast from memory into the dot product.
      const auto quad_codes = [q](size_t quad) {
        int32_t four;
        std::memcpy(&four, q + 4 * quad, 4);
        return four;
      };
      // Two chains of four, so consecutive heads' chains overlap less on one accumulator.
      __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
      for (size_t quad = 0; quad < 8; quad += 2) {
        even = _mm512_dpbusd_epi32(even, codes[quad], _mm512_set1_epi32(quad_codes(quad)));
        odd = _mm512_dpbusd_epi32(odd, codes[quad + 1], _mm512_set1_epi32(quad_codes(quad + 1)));
      }
      // |sum| <= 32 · 24 · 12 per lane: exact in int32 and in the conversion to float64.
      const __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(even, odd), _mm512_set1_epi32(q_offset[h * blocks + b]));
      const __m512d qs = _mm512_set1_pd(q_scale[h * blocks + b]);
      // The zero-masked forms with all lanes set: GCC 12's plain forms start from an undefined vector
      // and trip -Wmaybe-uninitialized.
      const __m512d lo = _mm512_maskz_cvtepi32_pd(0xFF, _mm512_maskz_extracti64x4_epi64(0xFF, sum, 0));
      const __m512d hi = _mm512_maskz_cvtepi32_pd(0xFF, _mm512_maskz_extracti64x4_epi64(0xFF, sum, 1));
      // Scale products are powers of two: exact, as in the Highway kernel's terms.
      double* a = acc + h * kTile;
      if (b == 0) {
        _mm512_store_pd(a, _mm512_mul_pd(lo, _mm512_mul_pd(key_scale_lo, qs)));
        _mm512_store_pd(a + 8, _mm512_mul_pd(hi, _mm512_mul_pd(key_scale_hi, qs)));
      } else {
        _mm512_store_pd(a, _mm512_fmadd_pd(lo, _mm512_mul_pd(key_scale_lo, qs), _mm512_load_pd(a)));
        _mm512_store_pd(a + 8, _mm512_fmadd_pd(hi, _mm512_mul_pd(key_scale_hi, qs), _mm512_load_pd(a + 8)));
      }
    }
  }
  for (size_t h = 0; h < n_heads; ++h) {
    _mm256_storeu_ps(dots + h * kTile, _mm512_maskz_cvtpd_ps(0xFF, _mm512_load_pd(acc + h * kTile)));
    _mm256_storeu_ps(dots + h * kTile + 8, _mm512_maskz_cvtpd_ps(0xFF, _mm512_load_pd(acc + h * kTile + 8)));
  }
}

#else  // not x86-64 with GCC or Clang

bool indexer_tiles_vnni_usable() { return false; }
void indexer_tile_dots_vnni(const uint8_t*, const double*, size_t, const int8_t*, const double*, const int16_t*, size_t,
                            float*) {}

#endif

}  // namespace cedar::ops::x86
