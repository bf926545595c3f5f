#include "kv/region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace cedar::kv {

namespace {
size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
}  // namespace

Result<AnonymousRegion> AnonymousRegion::map(size_t bytes, const char* what) {
  AnonymousRegion r;
  if (bytes == 0) return r;
  const size_t page = page_size();
  const size_t mapped = (bytes + page - 1) / page * page;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return io_error(std::string("kv: cannot reserve ") + std::to_string(mapped) + " bytes of address space for " +
                        what + " (lower the context/capacity, or allow overcommit)",
                    errno);
  }
  r.data_ = static_cast<uint8_t*>(p);
  r.size_ = bytes;
  r.mapped_ = mapped;
  return r;
}

AnonymousRegion::~AnonymousRegion() {
  if (data_) ::munmap(data_, mapped_);
}

AnonymousRegion& AnonymousRegion::operator=(AnonymousRegion&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, mapped_);
    data_ = o.data_;
    size_ = o.size_;
    mapped_ = o.mapped_;
    o.data_ = nullptr;
    o.size_ = o.mapped_ = 0;
  }
  return *this;
}

void AnonymousRegion::release_pages(size_t offset, size_t bytes) {
  const size_t page = page_size();
  const size_t begin = (offset + page - 1) / page * page;
  const size_t end = (offset + bytes) / page * page;
  if (end > begin && end <= mapped_) ::madvise(data_ + begin, end - begin, MADV_DONTNEED);
}

}  // namespace cedar::kv
