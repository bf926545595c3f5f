// Element types of checkpoint tensors, named as in the safetensors header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace cedar {

enum class Dtype : uint8_t {
  kBF16,    // "BF16"
  kF16,     // "F16"
  kF32,     // "F32"
  kF8E4M3,  // "F8_E4M3"  (OCP E4M3FN: no inf, 0x7F/0xFF are NaN, max 448)
  kF8E8M0,  // "F8_E8M0"  (unsigned power-of-two scale: value = 2^(b-127), 0xFF is NaN)
  kI8,      // "I8"       (V4.1 stores packed FP4 E2M1 pairs as I8: even element in the low nibble)
  kU8,      // "U8"
  kI32,     // "I32"
  kI64,     // "I64"
};

// Bytes per element (packed FP4 is stored as I8, one byte per *pair*; shapes say bytes).
size_t dtype_size(Dtype dtype);
// Safetensors spelling ("F8_E4M3"); parse returns nullopt for names cedar does not know.
const char* dtype_name(Dtype dtype);
std::optional<Dtype> parse_dtype(std::string_view name);

}  // namespace cedar
