#include "weights/weight_map.h"

#include <sstream>

#include "core/check.h"

namespace cedar::model {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool is_float_dtype(Dtype d) {
  return d == Dtype::kBF16 || d == Dtype::kF16 || d == Dtype::kF32;
}

void append_list(std::ostringstream& os, const char* title, const std::vector<std::string>& items) {
  if (items.empty()) return;
  os << "\n  " << title << " (" << items.size() << "):";
  size_t shown = 0;
  for (const auto& s : items) {
    if (++shown > 50) {
      os << "\n    ... and " << items.size() - 50 << " more";
      break;
    }
    os << "\n    " << s;
  }
}

}  // namespace

Result<WeightMap> WeightMap::bind(const io::Checkpoint& ckpt, const std::vector<WeightSpec>& inventory,
                                  const WeightCheckOptions& options) {
  WeightMap map;
  std::vector<std::string> missing, mismatched, unexpected;
  std::map<std::string_view, bool> expected;
  for (const WeightSpec& w : inventory) {
    expected[w.name] = true;
    const io::TensorView* t = ckpt.find(w.name);
    if (!t) {
      missing.push_back(w.name + " " + dtype_name(w.dtype) + " " + shape_str(w.shape));
      continue;
    }
    const bool vision = w.group == WeightGroup::kVision;
    const bool dtype_ok = t->dtype == w.dtype ||
                          (vision && options.lenient_vision_dtypes && is_float_dtype(t->dtype) &&
                           is_float_dtype(w.dtype));
    if (!dtype_ok || t->shape != w.shape) {
      mismatched.push_back(w.name + " in " + t->file + ": expected " + dtype_name(w.dtype) + " " +
                           shape_str(w.shape) + ", found " + dtype_name(t->dtype) + " " + shape_str(t->shape));
      continue;
    }
    map.by_name_[w.name] = t;
  }
  for (const io::TensorView* t : ckpt.tensors())
    if (!expected.count(t->name)) unexpected.push_back(t->name + " (in " + t->file + ")");
  if (missing.empty() && mismatched.empty() && unexpected.empty()) return map;
  std::ostringstream os;
  os << "checkpoint " << ckpt.dir() << " does not match the tensor inventory its config.json implies";
  append_list(os, "missing tensors", missing);
  append_list(os, "wrong dtype or shape", mismatched);
  append_list(os, "unexpected tensors", unexpected);
  os << "\n  (is config.json the one released with these weights?)";
  return data_loss(os.str());
}

const io::TensorView* WeightMap::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const io::TensorView& WeightMap::at(std::string_view name) const {
  const io::TensorView* t = find(name);
  CEDAR_CHECK(t != nullptr, "tensor %.*s is not in the weight map", static_cast<int>(name.size()), name.data());
  return *t;
}

}  // namespace cedar::model
