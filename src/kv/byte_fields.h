// Little-endian fixed-offset fields of the kv module's on-disk and on-wire records (block files,
// tier records): a memcpy each way, so unaligned offsets are fine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cedar::kv {

template <typename T>
void put_field(uint8_t* p, size_t off, T v) {
  std::memcpy(p + off, &v, sizeof(T));
}

template <typename T>
T get_field(const uint8_t* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}

}  // namespace cedar::kv
