// Internals shared by the linear kernels and their tests (not part of the public ops API).
#pragma once

#include <cstddef>

#include "core/thread_pool.h"

namespace cedar::ops {

// The block partial of the FP8 / FP4 GEMMs (see linear.h): the exact sum of the 32 products of one
// K block, rounded once to fp32. Each product (E4M3 x E4M3 or E4M3 x E2M1 values) is exact in fp32 and
// a multiple of 2^-18 below 2^17.6, so the 32-term sum is a multiple of 2^-18 below 2^23: at most 41
// significant bits, exact in float64 whatever the order. Fast paths may therefore add the promoted
// products in any order and still agree with this definition bit for bit.
inline float block_dot32_exact(const float* a, const float* w) {
  double sum = 0.0;
  for (int i = 0; i < 32; ++i) sum += static_cast<double>(a[i] * w[i]);
  return static_cast<float>(sum);
}

// Splits the output rows [0, n) of a linear over the pool in multiples of `grain`: by default 16 (one
// fast GEMM panel; large enough to amortise the hand-off), 32 for FP8 weights (one row of weight
// scales, which the fast GEMV prepares once per range). Small outputs run inline.
template <typename Fn>
void for_rows(ThreadPool* pool, size_t n, Fn&& fn, size_t grain = 16) {
  if (pool == nullptr || pool->size() <= 1 || n < 64) {
    fn(size_t{0}, n);
    return;
  }
  pool->parallel_for(n, grain, [&](size_t begin, size_t end, int) { fn(begin, end); });
}

}  // namespace cedar::ops
