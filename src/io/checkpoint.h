// Checkpoint: every tensor of a model directory, mapped in place. A directory holds either
// `model.safetensors.index.json` (Hugging Face sharded layout: "weight_map" name -> shard file)
// plus the shards it lists, or a single `model.safetensors`.
//
// Opening maps each shard and validates its header and the index against each other; no weight
// byte is copied or read (unless CheckpointOptions::read_all_data asks for it). A corrupt or
// inconsistent checkpoint gives one error that names the shard file and the tensor(s) involved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "io/safetensors.h"

namespace cedar::io {

inline constexpr const char* kIndexFileName = "model.safetensors.index.json";
inline constexpr const char* kSingleFileName = "model.safetensors";

// Reported while a checkpoint opens, so a CLI can draw a progress bar.
struct CheckpointProgress {
  enum class Phase {
    kHeaders,  // mapping shards and validating headers; bytes count whole shard files
    kData,     // read_all_data: reading every tensor byte; bytes count tensor bytes read
  };
  Phase phase = Phase::kHeaders;
  size_t shards_done = 0;
  size_t shards_total = 0;
  size_t tensors_done = 0;
  size_t tensors_total = 0;  // from the index; grows shard by shard for a single file
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  std::string current_file;  // plain shard file name
};

struct CheckpointOptions {
  // Called after each shard (headers phase) and about every 64 MiB (data phase). May be empty.
  std::function<void(const CheckpointProgress&)> progress;
  // Also read every tensor byte once with pread (not through the mapping: a disk error then is an
  // IoError naming the shard and tensor, where a mapped read would die of SIGBUS). This pulls the
  // whole checkpoint through the page cache, so it is slow for big models; off by default.
  bool read_all_data = false;
  // When set, only the tensors it accepts are mapped (the others keep data == nullptr and are read by
  // whoever streams them); unset maps every shard whole.
  TensorFilter map_filter;
};

class Checkpoint {
 public:
  // Errors (each message names `dir` and the shard file, and the tensors involved):
  //   NotFound  - neither index nor model.safetensors in dir; a shard the index lists is absent
  //   DataLoss  - index JSON malformed, or a shard name that is not a plain file name in dir
  //               (path traversal), a tensor the index places in a shard that lacks it, a shard
  //               tensor the index does not list (all such tensors are listed), any header error
  //   IoError   - an OS call failed (open, mmap, pread)
  static Result<Checkpoint> open(const std::string& dir, const CheckpointOptions& options = {});

  Checkpoint() = default;
  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;

  const std::string& dir() const { return dir_; }
  // nullptr when there is no tensor of that name.
  const TensorView* find(std::string_view name) const;
  // Like find, but a missing tensor is a NotFound naming the tensor and the checkpoint dir.
  Result<const TensorView*> require(std::string_view name) const;
  // Every tensor, sorted by name; pointers stay valid for the life of the Checkpoint (moves too).
  const std::vector<const TensorView*>& tensors() const { return sorted_; }
  size_t tensor_count() const { return sorted_.size(); }
  uint64_t total_bytes() const { return total_bytes_; }  // sum of tensor nbytes
  // Shards in the order they were opened (sorted by file name).
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  std::vector<std::string> shard_names() const;  // plain file names, same order as shards()
  bool is_sharded() const { return sharded_; }
  // The index's metadata.total_size when present (informational: writers disagree on it).
  std::optional<uint64_t> index_total_size() const { return index_total_size_; }
  // Page-cache hints for one tensor (see MappedFile::prefetch / drop).
  void prefetch(const TensorView& tensor) const;
  void drop(const TensorView& tensor) const;

 private:
  const SafetensorsFile* shard_of(const TensorView& tensor) const;

  std::string dir_;
  bool sharded_ = false;
  std::optional<uint64_t> index_total_size_;
  uint64_t total_bytes_ = 0;
  std::vector<SafetensorsFile> shards_;
  std::vector<const TensorView*> sorted_;   // by name
  std::vector<uint32_t> sorted_shard_;      // shard index of sorted_[i]
};

}  // namespace cedar::io
