// Internals shared by the linear kernels and their tests (not part of the public ops API).
#pragma once

#include <cstddef>

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

}  // namespace cedar::ops
