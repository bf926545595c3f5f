// Internals shared by the linear kernels and their tests (not part of the public ops API).
#pragma once

#include <cstddef>

namespace cedar::ops {

// The canonical summation order of one 32-element block of exact products (see linear.h):
// lane l accumulates products l, l+8, l+16, l+24 in that order, then the 8 lanes are added as
// ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)). Any SIMD width that divides 8 reproduces it exactly.
inline float block_dot32_canonical(const float* a, const float* w) {
  float s[8];
  for (int l = 0; l < 8; ++l) {
    float acc = a[l] * w[l];
    acc += a[l + 8] * w[l + 8];
    acc += a[l + 16] * w[l + 16];
    acc += a[l + 24] * w[l + 24];
    s[l] = acc;
  }
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

}  // namespace cedar::ops
