// The AMX-BF16 tiles of gemm_amx_x86.h. Built with target attributes, so the file compiles for any
// x86-64 baseline and is only entered after the run-time check.
#include "ops/gemm_amx_x86.h"

#include <atomic>

#include "ops/x86_features.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define CEDAR_GEMM_AMX_X86 1
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
CEDAR_AMX_TARGET void release() { _tile_release(); }

#undef CEDAR_AMX_TARGET

}  // namespace

bool gemm_amx_usable() {
  static const bool granted = amx_granted();
  return granted && g_allowed.load(std::memory_order_relaxed);
}

AmxTiles::AmxTiles() { load_config(); }
AmxTiles::~AmxTiles() { release(); }

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

#endif

}  // namespace cedar::ops::x86
