// Safetensors reader. A file is: 8-byte little-endian N, then N bytes of JSON header, then the data
// section. The header maps tensor name -> {dtype, shape, data_offsets [begin, end)} (offsets
// relative to the data section) plus an optional "__metadata__" string map.
//
// Everything in a header is treated as hostile: every violation becomes a Status naming the file
// and the tensor, never a crash and never an out-of-range read. Tensor bytes are not copied:
// TensorView::data points into the read-only mapping of the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "io/mapped_file.h"

namespace cedar::io {

// Largest JSON header accepted, as in the reference safetensors implementation (100 MB). The real
// V4.1 shards have headers of well under 1 MB.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// One tensor of a checkpoint, viewed in place.
struct TensorView {
  std::string name;
  Dtype dtype = Dtype::kU8;
  // As stored. Packed FP4 experts are I8 with the last dim in bytes (= logical columns / 2,
  // the even element in the low nibble).
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the file mapping; valid while the owning file lives
  size_t nbytes = 0;              // == numel() * dtype_size(dtype)
  uint64_t file_offset = 0;       // absolute offset of `data` in the file
  std::string file;               // path of the file that holds the bytes

  int64_t numel() const;  // product of shape (1 for a scalar)
  std::span<const uint8_t> bytes() const { return {data, nbytes}; }
};

// A header record, before it is bound to a mapping.
struct SafetensorsEntry {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;  // [d0, d1, ...]
  uint64_t begin = 0;          // byte offsets into the data section, begin <= end
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N, the JSON length (trailing space padding included)
  uint64_t data_offset = 0;   // 8 + N: file offset of the data section
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
  std::vector<SafetensorsEntry> tensors;         // ascending by `begin` (data order)
};

// The parser core: validates the header of a safetensors file whose complete contents are
// `file_bytes`. Works on any in-memory buffer (the fuzz target drives it directly). `file_label`
// names the file in error messages.
//
// Checks: file holds the 8-byte prefix; N <= kMaxSafetensorsHeaderBytes and 8 + N <= file size;
// the header is a JSON object with no name given twice; "__metadata__" is an object of strings;
// each tensor has a known "dtype" string, a "shape" array of at most 64 non-negative integers
// whose product times the dtype size does not overflow, and "data_offsets" [begin, end] with
// begin <= end <= data-section size and end - begin == numel * dtype size; no two tensors overlap.
// Gaps between tensors and bytes after the last one are allowed (other writers pad); unknown
// fields in an entry are ignored, as the reference reader does. The JSON is streamed (SAX), so
// memory is proportional to the tensor count and no nesting depth can exhaust the stack. The
// first problem found (in file order) is the one reported.
//
// Error codes: DataLoss for a corrupt or truncated file, Unimplemented for a dtype that the
// safetensors format defines but cedar does not support (e.g. F64), NotFound never.
Result<SafetensorsHeader> parse_safetensors_header(std::span<const uint8_t> file_bytes,
                                                   std::string_view file_label);
// The same checks when only the start of the file is at hand: `head` holds its first bytes (at least
// 8 + N of them when the file has that many, fewer only when the file is shorter), `file_size` is its size.
Result<SafetensorsHeader> parse_safetensors_header(std::span<const uint8_t> head, uint64_t file_size,
                                                   std::string_view file_label);

// Which tensors of a file to map (true = map). Tensors left out keep data == nullptr: their bytes are
// read some other way (streamed experts and Engram tables, docs/STREAMING.md).
using TensorFilter = std::function<bool(std::string_view name)>;

// One mapped safetensors file with its validated tensor table.
class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors: IoError (cannot open/map), DataLoss/Unimplemented (see
  // parse_safetensors_header); every message names `path`.
  static Result<SafetensorsFile> open(const std::string& path);
  // Reads the header with pread and maps only the runs of tensors `keep` accepts (each run of
  // consecutive kept tensors, in file order, is one mapping). Same errors as open().
  static Result<SafetensorsFile> open(const std::string& path, const TensorFilter& keep);

  SafetensorsFile() = default;
  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::string& path() const { return path_; }
  // The whole-file mapping (empty when the file was opened with a filter).
  const MappedFile& mapping() const { return mapping_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // In data order. Element addresses are stable for the life of the object, moves included.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor of that name.
  const TensorView* find(std::string_view name) const;
  uint64_t tensor_bytes() const { return tensor_bytes_; }  // sum of nbytes

  // Page-cache hints for one tensor of this file (see MappedFile::prefetch / drop).
  void prefetch(const TensorView& tensor) const;
  void drop(const TensorView& tensor) const;

 private:
  Status bind(SafetensorsHeader header, const TensorFilter* keep);
  const MappedFile* window_of(const TensorView& tensor) const;

  std::string path_;
  uint64_t file_size_ = 0;
  MappedFile mapping_;
  std::vector<MappedFile> windows_;  // with a filter: one mapping per run of kept tensors
  uint64_t data_offset_ = 0;
  uint64_t tensor_bytes_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorView> tensors_;
  std::vector<uint32_t> by_name_;  // indices into tensors_, sorted by name
};

}  // namespace cedar::io
