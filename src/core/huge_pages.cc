#include "core/huge_pages.h"

#include <sys/mman.h>

namespace cedar {

HugePageBytes allocate_huge_page_bytes(size_t bytes, bool advise) {
  const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = std::aligned_alloc(kHugePageBytes, rounded == 0 ? kHugePageBytes : rounded);
  if (p != nullptr && advise) (void)madvise(p, rounded, MADV_HUGEPAGE);
  return HugePageBytes(static_cast<uint8_t*>(p));
}

}  // namespace cedar
