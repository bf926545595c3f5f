// The AMX-BF16 tiles of x86_gemm_amx.h. Built with target attributes, so the file compiles for any
// x86-64 baseline and is only entered after the run-time check.
#include "ops/linear/x86_gemm_amx.h"

#include <algorithm>
#include <atomic>

#include "ops/formats/formats.h"
#include "ops/simd/x86_features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define CEDAR_GEMM_AMX_X86 1
#include "ops/linear/x86_fp4_block-inl.h"
#endif

namespace cedar::ops::x86 {
namespace {
std::atomic<bool> g_allowed{true};
}  // namespace

void set_gemm_amx_allowed(bool allowed) { g_allowed.store(allowed, std::memory_order_relaxed); }

#ifdef CEDAR_GEMM_AMX_X86

namespace {

// Linux's arch_prctl request for a dynamically enabled state component, and the component number of
// the tile data (asm/prctl.h and the XSAVE layout; glibc 2.36 defines neither).
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool amx_granted() {
  if (!has_avx512_bf16() || !__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-bf16")) return false;
  // Fails on kernels before 5.16 and where the hypervisor does not expose the state: no tiles then.
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// Palette 1: tiles 0-3 the accumulators (one per panel), 4 the activations, 5 and 6 the panels in
// turn (the next panel loads while the previous product runs); all 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

#define CEDAR_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))

template <size_t NP>
CEDAR_AMX_TARGET void tiles(size_t m16, const uint32_t* act, size_t lda, const uint32_t* const* panel, size_t pairs,
                            float* const* acc, bool first) {
  const size_t act_stride = lda * sizeof(uint32_t);
  constexpr size_t kRowBytes = 64;
  for (size_t m0 = 0; m0 < m16; m0 += 16) {
    if (first) {
      _tile_zero(0);
      if constexpr (NP > 1) _tile_zero(1);
      if constexpr (NP > 2) _tile_zero(2);
      if constexpr (NP > 3) _tile_zero(3);
    } else {
      _tile_loadd(0, acc[0] + m0 * 16, kRowBytes);
      if constexpr (NP > 1) _tile_loadd(1, acc[1] + m0 * 16, kRowBytes);
      if constexpr (NP > 2) _tile_loadd(2, acc[2] + m0 * 16, kRowBytes);
      if constexpr (NP > 3) _tile_loadd(3, acc[3] + m0 * 16, kRowBytes);
    }
    const uint32_t* rows = act + m0 * lda;
    for (size_t p = 0; p < pairs; p += 16) {
      _tile_loadd(4, rows + p, act_stride);
      _tile_loadd(5, panel[0] + p * 16, kRowBytes);
      _tile_dpbf16ps(0, 4, 5);
      if constexpr (NP > 1) {
        _tile_loadd(6, panel[1] + p * 16, kRowBytes);
        _tile_dpbf16ps(1, 4, 6);
      }
      if constexpr (NP > 2) {
        _tile_loadd(5, panel[2] + p * 16, kRowBytes);
        _tile_dpbf16ps(2, 4, 5);
      }
      if constexpr (NP > 3) {
        _tile_loadd(6, panel[3] + p * 16, kRowBytes);
        _tile_dpbf16ps(3, 4, 6);
      }
    }
    _tile_stored(0, acc[0] + m0 * 16, kRowBytes);
    if constexpr (NP > 1) _tile_stored(1, acc[1] + m0 * 16, kRowBytes);
    if constexpr (NP > 2) _tile_stored(2, acc[2] + m0 * 16, kRowBytes);
    if constexpr (NP > 3) _tile_stored(3, acc[3] + m0 * 16, kRowBytes);
  }
}

// The configuration in static storage: ldtilecfg faulted on one built on the stack.
constexpr TileConfig make_config() {
  TileConfig c;
  for (int t = 0; t < 7; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  return c;
}
alignas(64) constexpr TileConfig kConfig = make_config();

CEDAR_AMX_TARGET void load_config() { _tile_loadconfig(&kConfig); }

constexpr size_t kStepBlocks = 8;                 // 32-element blocks per decoding step
constexpr size_t kStepWords = kStepBlocks * 32;   // bf16 per row and step (512 bytes)

#define CEDAR_AMX_DECODE_TARGET __attribute__((target("avx512f,avx512bw,amx-tile,amx-bf16")))

// Blocks [b0, b0 + nb) of 16 weight rows (row i is min(i, nr - 1): the rows past nr repeat the last,
// whose sums are never read) to bf16 in natural order, row i at out + i * kStepWords.
CEDAR_AMX_DECODE_TARGET void decode_step(const uint8_t* packed, const uint8_t* scales, size_t k, size_t n0, size_t nr,
                                         size_t b0, size_t nb, uint16_t* out) {
  const __m512i table = _mm512_load_si512(kE2m1Bf16Words.bits);
  const size_t kblocks = k / 32;
  for (size_t i = 0; i < 16; ++i) {
    const size_t row = n0 + std::min(i, nr - 1);
    for (size_t b = b0; b < b0 + nb; ++b)
      _mm512_store_si512(out + i * kStepWords + (b - b0) * 32,
                         fp4_block_bf16_pairs(packed + row * (k / 2) + 16 * b, scales[row * kblocks + b], table));
  }
}

// The tile products of one decoded step: per 32-K block, the weights' tile (4) times each row tile's
// activations (5 and 6 in turn) into accumulator t.
template <size_t T>
CEDAR_AMX_TARGET void multiply_step(const uint16_t* weights, const uint32_t* amx_pairs, size_t b0, size_t nb) {
  for (size_t b = 0; b < nb; ++b) {
    _tile_loadd(4, weights + b * 32, kStepWords * sizeof(uint16_t));
    const uint32_t* act = amx_pairs + (b0 + b) * T * 256;
    _tile_loadd(5, act, 64);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (T > 1) {
      _tile_loadd(6, act + 256, 64);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (T > 2) {
      _tile_loadd(5, act + 512, 64);
      _tile_dpbf16ps(2, 4, 5);
    }
    if constexpr (T > 3) {
      _tile_loadd(6, act + 768, 64);
      _tile_dpbf16ps(3, 4, 6);
    }
  }
}

// fp4_rows_amx after its checks. Steps are decoded into two buffers in turn, one step ahead of the
// products: a tile load right after the stores that wrote its data would wait for them to drain.
template <size_t T>
CEDAR_AMX_TARGET void rows_amx(const uint32_t* amx_pairs, size_t m, const uint8_t* packed, const uint8_t* scales,
                               size_t k, size_t n0, size_t nr, float* y, size_t n_total) {
  alignas(64) uint16_t buffers[2][16 * kStepWords];
  const size_t kblocks = k / 32;
  _tile_zero(0);
  if constexpr (T > 1) _tile_zero(1);
  if constexpr (T > 2) _tile_zero(2);
  if constexpr (T > 3) _tile_zero(3);
  size_t step = 0;
  decode_step(packed, scales, k, n0, nr, 0, std::min(kStepBlocks, kblocks), buffers[0]);
  for (size_t b0 = kStepBlocks; b0 < kblocks; b0 += kStepBlocks, ++step) {
    decode_step(packed, scales, k, n0, nr, b0, std::min(kStepBlocks, kblocks - b0), buffers[(step + 1) % 2]);
    multiply_step<T>(buffers[step % 2], amx_pairs, b0 - kStepBlocks, kStepBlocks);
  }
  const size_t last = step * kStepBlocks;
  multiply_step<T>(buffers[step % 2], amx_pairs, last, kblocks - last);
  alignas(64) float sums[4][16 * 16];
  _tile_stored(0, sums[0], 64);
  if constexpr (T > 1) _tile_stored(1, sums[1], 64);
  if constexpr (T > 2) _tile_stored(2, sums[2], 64);
  if constexpr (T > 3) _tile_stored(3, sums[3], 64);
  for (size_t r = 0; r < m; ++r)
    for (size_t i = 0; i < nr; ++i) y[r * n_total + n0 + i] = round_bf16(sums[r / 16][i * 16 + r % 16]);
}

#undef CEDAR_AMX_DECODE_TARGET
CEDAR_AMX_TARGET void release() { _tile_release(); }

#undef CEDAR_AMX_TARGET

}  // namespace

bool gemm_amx_usable() {
  static const bool granted = amx_granted();
  return granted && g_allowed.load(std::memory_order_relaxed);
}

AmxTiles::AmxTiles() { load_config(); }
AmxTiles::~AmxTiles() { release(); }

void amx_pairs_from_rows(const uint32_t* pairs, size_t m, size_t k, uint32_t* amx_pairs) {
  const size_t tiles = (m + 15) / 16, steps = k / 32;
  for (size_t j = 0; j < steps; ++j)
    for (size_t t = 0; t < tiles; ++t) {
      uint32_t* tile = amx_pairs + (j * tiles + t) * 256;
      for (size_t p = 0; p < 16; ++p)
        for (size_t r = 0; r < 16; ++r) {
          const size_t row = 16 * t + r;
          tile[p * 16 + r] = row < m ? pairs[row * (k / 2) + 16 * j + p] : 0u;
        }
    }
}

bool fp4_rows_amx(const uint32_t* amx_pairs, size_t m, int act_lo, int act_hi, const uint8_t* packed,
                  const uint8_t* scales, size_t k, size_t n0, size_t nr, float* y, size_t n_total) {
  const size_t kblocks = k / 32;
  int s_lo = 255, s_hi = 0;
  for (size_t i = 0; i < nr; ++i)
    for (size_t b = 0; b < kblocks; ++b) {
      s_lo = std::min<int>(s_lo, scales[(n0 + i) * kblocks + b]);
      s_hi = std::max<int>(s_hi, scales[(n0 + i) * kblocks + b]);
    }
  // The decoded values' exponent fields lie in [s - 1, s + 2] (E2M1's 0.5..6), as for the panels.
  if (s_lo < 2 || s_hi > 252 || act_lo + (s_lo - 1) - 254 < -126 || act_hi + (s_hi + 2) - 252 > 127) return false;
  switch ((m + 15) / 16) {
    case 4: rows_amx<4>(amx_pairs, m, packed, scales, k, n0, nr, y, n_total); break;
    case 3: rows_amx<3>(amx_pairs, m, packed, scales, k, n0, nr, y, n_total); break;
    case 2: rows_amx<2>(amx_pairs, m, packed, scales, k, n0, nr, y, n_total); break;
    default: rows_amx<1>(amx_pairs, m, packed, scales, k, n0, nr, y, n_total); break;
  }
  return true;
}

void panel_tiles_amx(size_t m16, const uint32_t* act_pairs, size_t lda_pairs, const uint32_t* const* panels,
                     size_t n_panels, size_t pairs, float* const* acc, bool first) {
  switch (n_panels) {
    case 4: return tiles<4>(m16, act_pairs, lda_pairs, panels, pairs, acc, first);
    case 3: return tiles<3>(m16, act_pairs, lda_pairs, panels, pairs, acc, first);
    case 2: return tiles<2>(m16, act_pairs, lda_pairs, panels, pairs, acc, first);
    default: return tiles<1>(m16, act_pairs, lda_pairs, panels, pairs, acc, first);
  }
}

#else  // not x86-64 with GCC or Clang

bool gemm_amx_usable() { return false; }
AmxTiles::AmxTiles() {}
AmxTiles::~AmxTiles() {}
void panel_tiles_amx(size_t, const uint32_t*, size_t, const uint32_t* const*, size_t, size_t, float* const*, bool) {}
void amx_pairs_from_rows(const uint32_t*, size_t, size_t, uint32_t*) {}
bool fp4_rows_amx(const uint32_t*, size_t, int, int, const uint8_t*, const uint8_t*, size_t, size_t, size_t, float*,
                  size_t) {
  return false;
}

#endif

}  // namespace cedar::ops::x86
