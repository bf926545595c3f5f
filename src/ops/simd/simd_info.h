// Which Highway targets cedar's kernels were compiled for and which one runtime dispatch picks.
#pragma once

#include <string>
#include <vector>

namespace cedar::ops {

// Name of the target HWY_DYNAMIC_DISPATCH selects now (e.g. "AVX3", "AVX2").
std::string dispatched_simd_target();
// Names of every target compiled into this binary, and of those this CPU supports.
std::vector<std::string> compiled_simd_targets();
std::vector<std::string> supported_simd_targets();

}  // namespace cedar::ops
