// SafetensorsWriter: builds safetensors files (used by make-tiny to write small sharded
// checkpoints and by tests to build fixtures).
//
// Layout: 8-byte little-endian header length N, a JSON header padded with spaces so that the data
// section starts at an 8-byte aligned offset, then the tensors in insertion order, back to back.
// Tensors are contiguous because the safetensors format forbids gaps (the reference Python/Rust
// reader rejects them), so a tensor is 8-byte aligned when the byte sizes before it are multiples
// of 8 (true of every real weight); readers must not assume more than byte alignment.
//
// Files are written atomically: a temp file in the same directory, fsync, rename, fsync of the
// directory. A full disk is ResourceExhausted naming the file; other OS failures are IoError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace cedar::io {

class SafetensorsWriter {
 public:
  // Adds a tensor; its bytes are copied (or moved in). InvalidArgument when the name is empty,
  // "__metadata__" or already added, a dimension is negative, or bytes.size() !=
  // numel * dtype_size(dtype) (packed FP4 as I8: the shape is in bytes).
  Status add(std::string name, Dtype dtype, std::vector<int64_t> shape,
             std::span<const uint8_t> bytes);
  Status add(std::string name, Dtype dtype, std::vector<int64_t> shape, std::vector<uint8_t>&& bytes);
  // Convenience for float data stored as F32.
  Status add_f32(std::string name, std::vector<int64_t> shape, std::span<const float> values);
  // A "__metadata__" entry (string -> string, as the format requires).
  void set_metadata(std::string key, std::string value);

  size_t tensor_count() const { return tensors_.size(); }
  uint64_t data_bytes() const { return data_bytes_; }  // sum of tensor byte sizes
  // The header JSON exactly as write() lays it out (padding included); for tests and tooling.
  std::string header_json() const;
  // Writes the file atomically (see the file comment). The writer can be written again.
  Status write(const std::string& path) const;

 private:
  struct Pending {
    std::string name;
    Dtype dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_bytes_ = 0;
};

// Writes `dir`/model.safetensors.index.json atomically:
//   {"metadata": {"total_size": total_size}, "weight_map": {name: shard_file, ...}}
// Shard names must be plain file names (no '/', not "." or ".."): InvalidArgument otherwise.
Status write_index_json(const std::string& dir, uint64_t total_size,
                        const std::map<std::string, std::string>& weight_map);

namespace detail {
// Writes all of [data, data + size) to fd, retrying short writes and EINTR. ENOSPC/EDQUOT/EFBIG
// give ResourceExhausted naming `path`; other errors IoError. Exposed for tests (/dev/full).
Status write_fully(int fd, const void* data, size_t size, const std::string& path);
// Atomic replace of `path` with `chunks` written in order (temp file + fsync + rename + dir fsync).
Status write_file_atomically(const std::string& path, std::span<const std::span<const uint8_t>> chunks);
}  // namespace detail

}  // namespace cedar::io
