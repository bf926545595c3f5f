// The indexer's integer key tiles (IndexKeyTiles, attention.h) on AVX512-VNNI: the block sums of 16
// keys as `vpdpbusd` byte dot products, four dimensions per int32 lane. The Highway kernel
// (IndexerScoresTiles in attention_exact.cc) widens through `vpmaddubsw` to int16 lanes, 8 keys per
// instruction, then joins the lanes; here one instruction takes 16 keys' four products each into
// int32, so a block of 32 dimensions is 8 instructions for 16 keys instead of 32 plus the joins.
// The sums are the same exact integers, and they meet the scales in the same float64 terms.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops::x86 {

// Whether this CPU has AVX512-F/BW/VL and AVX512-VNNI and tests have not turned the kernel off.
bool indexer_tiles_vnni_usable();
// Tests: false sends the tiles to the Highway kernel, so both run.
void set_indexer_tiles_vnni_allowed(bool allowed);

// The most heads indexer_tile_dots_vnni takes.
inline constexpr size_t kIndexerTileMaxHeads = 128;

// For one tile of 16 keys and each head h < n_heads (<= kIndexerTileMaxHeads):
//   dots[h * 16 + i] = fp32( Σ_b (Σ_{d in block b} q_codes[h, d] · (tile code[i, d] - 12) ) ·
//                                (tile_scales[b * 16 + i] · q_scale[h * blocks + b]) )
// with the float64 terms added in block order and rounded once. q_offset[h * blocks + b] is
// 12 · Σ q_codes over the block (what the codes' +12 adds). tile_codes: the tile's head_dim · 16
// bytes; tile_scales: its blocks · 16 scales; q_codes [n_heads, head_dim], |code| <= 12; blocks =
// head_dim / 32. Only callable when indexer_tiles_vnni_usable().
void indexer_tile_dots_vnni(const uint8_t* tile_codes, const double* tile_scales, size_t head_dim,
                            const int8_t* q_codes, const double* q_scale, const int16_t* q_offset, size_t n_heads,
                            float* dots);

}  // namespace cedar::ops::x86
