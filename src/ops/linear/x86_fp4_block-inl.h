// One FP4 block as bf16 pairs in zmm registers, shared by the prefill's FP4 decoders on x86
// (x86_gemm_bf16.cc's panels, x86_gemm_amx.cc's left-hand tiles). Include only where
// <immintrin.h> is available (x86-64 with GCC or Clang).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "ops/formats/formats.h"

namespace cedar::ops::x86 {

// The 16 packed bytes of one block (32 E2M1 codes, the even element in the low nibble) as 16 u32
// bf16 pairs (element 2p in the low half, 2p + 1 in the high half) of E2M1 · 2^(scale - 127). Byte p
// sits in dword p; OR-ing in the dword shifted left by 12 puts the high nibble at bits 16-19, so the
// low word indexes the low nibble (plus a bit the table ignores) and the high word the high nibble:
// one word lookup in kE2m1Bf16Words (`table`) decodes the pair. The scale's exponent is added to the
// nonzero values (zeros and -0 stay), exact while the fields stay in 1..254: 2 <= scale <= 252.
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m512i fp4_block_bf16_pairs(const uint8_t* block,
                                                                                           int scale, __m512i table) {
  constexpr __mmask16 kAll16 = 0xFFFF;  // (the masked forms: GCC 12's plain ones warn of an undefined start)
  const __m512i bytes = _mm512_maskz_cvtepu8_epi32(kAll16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
  const __m512i index = _mm512_or_si512(bytes, _mm512_maskz_slli_epi32(kAll16, bytes, 12));
  const __m512i pair = _mm512_maskz_permutexvar_epi16(~__mmask32{0}, index, table);
  const __mmask32 nonzero = _mm512_test_epi16_mask(pair, _mm512_set1_epi16(0x7FFF));
  return _mm512_mask_add_epi16(pair, nonzero, pair, _mm512_set1_epi16(static_cast<short>((scale - 127) << 7)));
}

}  // namespace cedar::ops::x86
