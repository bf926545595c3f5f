// BlockReader: asynchronous positional reads from a fixed set of files (the checkpoint's shards),
// used to stream routed experts and Engram rows into memory the caller owns.
//
// Backend: io_uring (liburing) when the kernel lets this process create a ring; otherwise (seccomp
// filters in containers answer EPERM/ENOSYS) a small pool of threads doing pread, with one log
// line saying so. Files are opened with O_DIRECT where the filesystem accepts it, so streamed bytes
// bypass the page cache (the cache would otherwise hold a second copy and evict the dense weights);
// a filesystem that refuses O_DIRECT (tmpfs, some overlays) gets buffered reads instead.
//
// With O_DIRECT, offset, length and destination must be multiples of alignment() (4096, the largest
// logical block size in use on NVMe); callers read the aligned superset of the bytes they want. A
// read may end short at the end of a file: a completion succeeds when at least `need` bytes arrived.
//
// One reader serves one consumer (tags are the consumer's); single consumer: submit() and reap() are called from one thread (the forward pass's thread); the
// pread pool's workers are internal. Nothing here allocates once the queues reached their high-water
// mark, so a decode loop that keeps issuing reads does not allocate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace cedar::io {

inline constexpr size_t kDirectIoAlignment = 4096;

struct ReadRequest {
  uint32_t file = 0;      // index into the paths given to open()
  uint64_t offset = 0;    // byte offset in the file
  uint64_t length = 0;    // bytes to read into dest
  uint64_t need = 0;      // bytes that must arrive (<= length; the rest may lie past the end of file)
  uint8_t* dest = nullptr;
  uint64_t tag = 0;       // returned in the completion
};

struct ReadCompletion {
  uint64_t tag = 0;
  int error = 0;          // 0, or an errno (EIO, ...); a short read below `need` reports ENODATA
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;     // bytes that arrived
};

struct BlockReaderOptions {
  bool direct = true;           // try O_DIRECT
  bool io_uring = true;         // try io_uring before the pread pool
  unsigned queue_depth = 64;    // reads in flight at once
  int pool_threads = 4;         // pread fallback workers
};

class BlockReader {
 public:
  // Opens every path read-only. Errors: IoError naming the path that cannot be opened.
  static Result<std::unique_ptr<BlockReader>> open(const std::vector<std::string>& paths,
                                                   const BlockReaderOptions& options = {});
  virtual ~BlockReader();

  // "io_uring" or "pread pool"; whether file i is read with O_DIRECT.
  virtual const char* backend() const = 0;
  bool direct(uint32_t file) const { return files_[file].direct; }
  const std::string& path(uint32_t file) const { return files_[file].path; }
  size_t file_count() const { return files_.size(); }

  // Queues a read (started at the latest by the next reap()). With O_DIRECT the request must be
  // aligned (CEDAR_CHECK: a caller bug, not an input error).
  void submit(const ReadRequest& r);
  // Starts queued reads and collects finished ones into `out`; with `wait`, blocks until at least one
  // completes (returns 0 at once when nothing is queued or in flight).
  size_t reap(std::span<ReadCompletion> out, bool wait);
  size_t outstanding() const { return queued_.size() - queue_head_ + in_flight_; }

  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t reads() const { return reads_; }

 protected:
  struct File {
    std::string path;
    int fd = -1;
    bool direct = false;
  };
  BlockReader() = default;
  // Moves queued requests to the backend while it has room.
  virtual void start_queued() = 0;
  virtual size_t collect(std::span<ReadCompletion> out, bool wait) = 0;
  bool pop_queued(ReadRequest* r);
  void account(const ReadRequest& r, int64_t result, ReadCompletion* c);

  std::vector<File> files_;
  std::vector<ReadRequest> queued_;
  size_t queue_head_ = 0;
  size_t in_flight_ = 0;
  uint64_t bytes_read_ = 0, reads_ = 0;
};

}  // namespace cedar::io
