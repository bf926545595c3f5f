#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <utility>

namespace cedar::io {
namespace {

size_t page_size() {
  static const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return kPage;
}


}  // namespace

namespace {

// Opens a regular file for reading: its descriptor and size.
Status open_regular_file(const std::string& path, int* fd, uint64_t* size) {
  *fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (*fd < 0) return io_error("cannot open " + path, errno);
  struct stat st {};
  if (fstat(*fd, &st) != 0) {
    int err = errno;
    ::close(*fd);
    return io_error("cannot stat " + path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(*fd);
    return invalid_argument(path + " is not a regular file");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return {};
}

// Maps [begin, begin + size) of fd read-only and closes fd (the mapping keeps the file alive).
//
// A mapping of at least 2 MiB is placed at an address congruent to its file offset modulo 2 MiB and
// advised MADV_HUGEPAGE. Where the kernel keeps a file's page cache in 2 MiB folios (Linux 6.x on
// ext4, xfs, btrfs; readahead allocates them for a VM_HUGEPAGE mapping), each folio is then mapped
// by one page-table entry instead of 512: a 475 GiB checkpoint needs about 1 MiB of page tables
// instead of about 950 MiB, takes 0.24 million page faults to touch instead of 125 million, and the
// GEMVs' weight streams cross a TLB entry every 2 MiB instead of every 4 KiB. Elsewhere the advice
// is refused (ignored) and the mapping is an ordinary one.
Result<uint8_t*> map_and_close(int fd, const std::string& path, uint64_t begin, size_t size) {
  uint8_t* data = nullptr;
  if (size > 0) {
    void* at = nullptr;
    int flags = MAP_SHARED;
    void* reserved = MAP_FAILED;
    size_t reserved_len = 0;
    if (size >= kHugePageBytes) {
      // Reserve 2 MiB more than needed (address space only), then map the file over the part of the
      // reservation that has the right alignment.
      reserved_len = size + kHugePageBytes;
      reserved = mmap(nullptr, reserved_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (reserved != MAP_FAILED) {
        const uintptr_t base = reinterpret_cast<uintptr_t>(reserved);
        const uintptr_t phase = static_cast<uintptr_t>(begin % kHugePageBytes);
        at = reinterpret_cast<void*>(base + (phase + kHugePageBytes - base % kHugePageBytes) % kHugePageBytes);
        flags |= MAP_FIXED;
      }
    }
    void* p = mmap(at, size, PROT_READ, flags, fd, static_cast<off_t>(begin));
    if (p == MAP_FAILED) {
      const int err = errno;
      if (reserved != MAP_FAILED) munmap(reserved, reserved_len);
      ::close(fd);
      return io_error("cannot mmap " + path + " (" + std::to_string(size) + " bytes at " + std::to_string(begin) + ")",
                      err);
    }
    if (reserved != MAP_FAILED) {
      // Give back the reservation's unused head and tail (MAP_FIXED replaced the middle).
      const uintptr_t base = reinterpret_cast<uintptr_t>(reserved), start = reinterpret_cast<uintptr_t>(p);
      const uintptr_t page = page_size(), end = (start + size + page - 1) / page * page;
      if (start > base) munmap(reserved, start - base);
      if (base + reserved_len > end) munmap(reinterpret_cast<void*>(end), base + reserved_len - end);
      (void)madvise(p, size, MADV_HUGEPAGE);
    }
    data = static_cast<uint8_t*>(p);
  }
  ::close(fd);
  return data;
}

}  // namespace

Result<MappedFile> MappedFile::open(const std::string& path) {
  int fd = -1;
  uint64_t file_size = 0;
  CEDAR_RETURN_IF_ERROR(open_regular_file(path, &fd, &file_size));
  const size_t size = static_cast<size_t>(file_size);
  CEDAR_ASSIGN_OR_RETURN(uint8_t* data, map_and_close(fd, path, 0, size));
  return MappedFile(path, data, size);
}

Result<MappedFile> MappedFile::open_range(const std::string& path, uint64_t offset, uint64_t length) {
  int fd = -1;
  uint64_t file_size = 0;
  CEDAR_RETURN_IF_ERROR(open_regular_file(path, &fd, &file_size));
  if (offset > file_size || length > file_size - offset) {
    ::close(fd);
    return invalid_argument(path + ": range [" + std::to_string(offset) + ", +" + std::to_string(length) +
                            ") lies past the end of the file");
  }
  const uint64_t begin = offset / page_size() * page_size();
  const size_t size = static_cast<size_t>(offset + length - begin);
  CEDAR_ASSIGN_OR_RETURN(uint8_t* data, map_and_close(fd, path, begin, size));
  return MappedFile(path, data, size, begin);
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      offset_(std::exchange(other.offset_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    offset_ = std::exchange(other.offset_, 0);
  }
  return *this;
}

void MappedFile::reset() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

bool MappedFile::contains(const void* p, size_t n) const {
  if (data_ == nullptr) return false;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const auto base = reinterpret_cast<uintptr_t>(data_);
  return addr >= base && addr - base <= size_ && n <= size_ - (addr - base);
}

namespace {

// Rounds [offset, offset + length) out to whole pages, clamped to [0, size). Returns false when
// nothing is left.
bool page_range(size_t size, size_t offset, size_t length, size_t* begin, size_t* len) {
  if (offset >= size || length == 0) return false;
  const size_t end = length > size - offset ? size : offset + length;
  const size_t page = page_size();
  *begin = offset / page * page;
  *len = end - *begin;  // madvise rounds the length up to a page itself
  return true;
}

}  // namespace

void MappedFile::prefetch(size_t offset, size_t length) const {
  size_t begin = 0, len = 0;
  if (data_ == nullptr || offset < offset_ || !page_range(size_, offset - offset_, length, &begin, &len)) return;
  (void)madvise(data_ + begin, len, MADV_WILLNEED);
}

void MappedFile::drop(size_t offset, size_t length) const {
  size_t begin = 0, len = 0;
  if (data_ == nullptr || offset < offset_ || !page_range(size_, offset - offset_, length, &begin, &len)) return;
  (void)madvise(data_ + begin, len, MADV_DONTNEED);
}

}  // namespace cedar::io
