// A softmax row in f32 vectors for fast numerics (the vision tower's attention, model/vision_tower.cc):
// with m = max_j(s_j * scale), writes bf16(exp(s_j * scale - m)) over s and returns the f32 sum of the
// unrounded exponentials (summed in vector lanes, then across them). Highway's Exp: within a few ulp of
// the correctly rounded exp the exact path uses.
#pragma once

#include <cstddef>

namespace cedar::ops::fast {

float softmax_row_bf16(float* s, size_t n, float scale);

}  // namespace cedar::ops::fast
