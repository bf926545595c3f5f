// MappedFile: a whole file mapped read-only into memory. Checkpoint weights are read in place
// through this mapping (never copied); the page cache is the only copy of a 511 GB checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/huge_pages.h"
#include "core/status.h"

namespace cedar::io {

// The alignment (and the smallest size) of the mappings advised for huge pages.
inline constexpr size_t kHugePageAlignment = kHugePageBytes;

class MappedFile {
 public:
  // Maps `path` read-only (MAP_SHARED, so pages are shared with the page cache and other
  // processes). An empty file maps to data() == nullptr, size() == 0. Errors are IoError naming
  // the path and the failing call. A mapping of 2 MiB or more starts at an address congruent to its
  // file offset modulo 2 MiB and is advised MADV_HUGEPAGE, so the kernel can map the page cache's
  // 2 MiB folios whole (kHugePageAlignment; mapped_file.cc says why).
  static Result<MappedFile> open(const std::string& path);
  // Maps only the bytes [offset, offset + length) of `path` (rounded out to whole pages), so that a
  // streaming run never maps the parts of a shard it reads itself. data() then holds file offset
  // offset() (page aligned, <= the requested offset). Errors as open(); a range past the end of the
  // file is an InvalidArgument.
  static Result<MappedFile> open_range(const std::string& path, uint64_t offset, uint64_t length);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  uint64_t offset() const { return offset_; }  // file offset of data()[0]; 0 for a whole file
  bool is_open() const { return data_ != nullptr || !path_.empty(); }

  // True when [p, p + n) lies inside the mapping (used to prove views point into it).
  bool contains(const void* p, size_t n) const;

  // Hints (offsets are file offsets), both clamped to the mapping and rounded out to whole pages; a hint that the kernel
  // refuses is harmless, so these return nothing.
  //   prefetch: MADV_WILLNEED, start reading these bytes from disk in the background.
  //   drop:     MADV_DONTNEED, release this process's pages for the range (the data stays
  //             readable: the next access faults it back in from the page cache or disk).
  void prefetch(size_t offset, size_t length) const;
  void drop(size_t offset, size_t length) const;

 private:
  MappedFile(std::string path, uint8_t* data, size_t size, uint64_t offset = 0)
      : path_(std::move(path)), data_(data), size_(size), offset_(offset) {}
  void reset();

  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  uint64_t offset_ = 0;
};

}  // namespace cedar::io
