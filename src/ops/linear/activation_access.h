// Ops-internal: the one way into a PreparedActivations handle (ops/linear/linear.h). The quantisers build
// handles from a layout they filled, the linear kernels (and the op tests) read the layout back. The
// model never includes this header; it only passes handles between kernel-set calls.
#pragma once

#include "ops/linear/activation_layout.h"
#include "ops/linear/linear.h"

namespace cedar::ops {

class ActivationAccess {
 public:
  static const ActivationLayout& layout(const PreparedActivations& a) { return a.layout_; }
  static ActivationLayout& layout(PreparedActivations& a) { return a.layout_; }
  static PreparedActivations wrap(const ActivationLayout& layout) {
    PreparedActivations a;
    a.layout_ = layout;
    return a;
  }
};

}  // namespace cedar::ops
