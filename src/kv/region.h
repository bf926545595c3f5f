// AnonymousRegion: a private anonymous memory mapping used for cache storage. The kernel backs a page
// only when it is first touched, so reserving room for a million tokens costs address space, not RAM;
// the figures `cedar kv-report` prints are sums of these reservations.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace cedar::kv {

class AnonymousRegion {
 public:
  AnonymousRegion() = default;
  // Maps `bytes` (rounded up to whole pages; 0 maps nothing). MAP_NORESERVE: no swap is reserved up
  // front, so a large reservation is refused only when the address space or the overcommit policy
  // (vm.overcommit_memory = 2) says so. The error names `what` and the size.
  static Result<AnonymousRegion> map(size_t bytes, const char* what);
  ~AnonymousRegion();
  AnonymousRegion(AnonymousRegion&& o) noexcept { *this = static_cast<AnonymousRegion&&>(o); }
  AnonymousRegion& operator=(AnonymousRegion&& o) noexcept;
  AnonymousRegion(const AnonymousRegion&) = delete;
  AnonymousRegion& operator=(const AnonymousRegion&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }          // bytes requested
  size_t mapped_size() const { return mapped_; } // bytes mapped (whole pages)
  // Returns the pages of [offset, offset + bytes) to the kernel (they read as zero afterwards).
  // Only whole pages inside the range are released.
  void release_pages(size_t offset, size_t bytes);

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
};

}  // namespace cedar::kv
