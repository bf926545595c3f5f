// Software prefetch for the GEMV kernels, which stream each weight byte once per token.
//
// A GEMV decodes and multiplies for a while per cache line, so the hardware's stream prefetcher alone
// leaves its loads waiting on DRAM. Two hints per line keep them arriving: one 8 KiB ahead into L2
// (prefetcht1: many lines in flight without filling L1) and one 1 KiB ahead into L1 (by then the line
// is in L2, so that fetch is short). Measured on a 2-core AVX-512 Xeon, 1 thread, FP8 matrices larger
// than the caches (`git show f6bfcca:docs/PERFORMANCE_LOG_2026-12-05.md`): 32768x1280 9.4 -> 12.0
// GB/s and 2304x5120 in 8 copies 16 -> 20 GB/s, against a single L1 hint 2 KiB ahead; a plain load
// loop reads 14.7 GB/s there.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cedar::ops {

inline constexpr size_t kPrefetchL2Bytes = 8192;
inline constexpr size_t kPrefetchL1Bytes = 1024;

// Call once per 64-byte line of a weight stream, with the line being read. The addresses are formed
// as integers: near a matrix's end they point past the buffer (a prefetch never faults, but pointer
// arithmetic past the end would be undefined).
//
// always_inline: the kernels are compiled per SIMD target (Highway's target pragmas), and GCC does not
// inline a plain inline function into them; called out of line, a function whose only effect is a
// prefetch counts as having no effect at all, and the call is deleted.
__attribute__((always_inline)) inline void prefetch_weight_stream(const void* line) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(line);
  __builtin_prefetch(reinterpret_cast<const void*>(at + kPrefetchL2Bytes), 0, 2);
  __builtin_prefetch(reinterpret_cast<const void*>(at + kPrefetchL1Bytes), 0, 3);
}

}  // namespace cedar::ops
