// WeightMap: binds a mapped checkpoint to the inventory the config predicts. Every tensor is
// checked by name, dtype and shape; all missing, unexpected and mis-shaped tensors are reported in
// one error. Lookups return views into the mapping (nothing is copied).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "spec/weight_inventory.h"

namespace cedar::model {

struct WeightCheckOptions {
  // The vision tower's dtypes are not verified against the release (spec §3); by default its
  // tensors are checked for presence and shape but any float dtype is accepted.
  bool lenient_vision_dtypes = true;
};

class WeightMap {
 public:
  // Fails with DataLoss listing every discrepancy (at most 50 per kind, then a count).
  static Result<WeightMap> bind(const io::Checkpoint& ckpt, const std::vector<WeightSpec>& inventory,
                                const WeightCheckOptions& options = {});

  // The tensor `name`; CEDAR_CHECKs that it exists (bind() proved every inventory name does).
  const io::TensorView& at(std::string_view name) const;
  const io::TensorView* find(std::string_view name) const;
  size_t size() const { return by_name_.size(); }

 private:
  std::map<std::string, const io::TensorView*, std::less<>> by_name_;
};

}  // namespace cedar::model
