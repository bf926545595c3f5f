// Anonymous memory on 2 MiB pages, for large arrays a decode step streams (weights re-coded at load).
//
// A GEMV reads its weights once per token in one stream; on 4 KiB pages that stream takes a TLB miss
// every 4 KiB. Where transparent huge pages are madvise-only (a common default), only memory advised
// MADV_HUGEPAGE gets 2 MiB pages; the checkpoint's mapping does this too (io/mapped_file.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace cedar {

struct HugePageFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using HugePageBytes = std::unique_ptr<uint8_t[], HugePageFree>;

inline constexpr size_t kHugePageBytes = size_t{2} << 20;  // a PMD on x86-64 and on arm64 with 4 KiB pages

// `bytes` (rounded up to whole 2 MiB pages) aligned to 2 MiB and, when `advise`, advised
// MADV_HUGEPAGE (refused advice leaves 4 KiB pages). nullptr when the memory cannot be had.
HugePageBytes allocate_huge_page_bytes(size_t bytes, bool advise = true);

}  // namespace cedar
