#include "core/dtype.h"

namespace cedar {
namespace {

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {Dtype::kBF16, "BF16", 2},       {Dtype::kF16, "F16", 2},         {Dtype::kF32, "F32", 4},
    {Dtype::kF8E4M3, "F8_E4M3", 1},  {Dtype::kF8E8M0, "F8_E8M0", 1},  {Dtype::kI8, "I8", 1},
    {Dtype::kU8, "U8", 1},           {Dtype::kI32, "I32", 4},         {Dtype::kI64, "I64", 8},
};

}  // namespace

size_t dtype_size(Dtype dtype) { return kDtypes[static_cast<int>(dtype)].size; }
const char* dtype_name(Dtype dtype) { return kDtypes[static_cast<int>(dtype)].name; }

std::optional<Dtype> parse_dtype(std::string_view name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

}  // namespace cedar
