// FileSystem: the OS calls the disk prefix cache uses to write a file. The default forwards to POSIX;
// tests substitute one that fails with ENOSPC after N bytes, or stops mid-write, to prove a full disk
// or a kill -9 never yields a usable partial file. Each call returns what POSIX returns (-1 with errno
// set on failure).
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace cedar::kv {

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  virtual int open(const char* path, int flags, mode_t mode);
  virtual ssize_t write(int fd, const void* data, size_t n);
  virtual int fsync(int fd);
  virtual int close(int fd);
  virtual int rename(const char* from, const char* to);

  // The process-wide POSIX implementation.
  static FileSystem& posix();
};

// Writes all n bytes, retrying short writes and EINTR; false with errno set on failure.
bool write_all(FileSystem& fs, int fd, const void* data, size_t n);

}  // namespace cedar::kv
