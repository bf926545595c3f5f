// The on-disk format of one cached KV block (DiskPrefixCache writes one file per block).
//
//   offset  size  field
//        0     8  magic "CEDARKVB"
//        8     4  format_version (kBlockFileVersion)
//       12     4  header_bytes (128)
//       16     8  layout_fingerprint   model + cache layout (CacheGeometry::layout_fingerprint)
//       24     8  chain_hash           chained hash of the prefix through this block (prefix_index.h)
//       32     8  uid                  this file's identity (random, nonzero; also in the file name)
//       40     8  parent_uid           the file holding the previous block of the prefix, 0 for block 0
//       48     4  depth                block index within the prefix
//       52     4  block_tokens
//       56     8  boundary_state_bytes
//       64     4  flags                bit 0: payload compressed with zstd
//       68     4  reserved (0)
//       72     8  raw_payload_bytes    KV bytes of the block (CacheGeometry::block_bytes)
//       80     8  stored_payload_bytes bytes actually stored (== raw unless compressed)
//       88     8  body_checksum        XXH3-64 of everything after the header
//       96    24  reserved (0)
//      120     8  header_checksum      XXH3-64 of bytes [0, 120)
//   then: block_tokens int32 token ids | boundary state | payload (raw KV or a zstd frame of it).
// All integers little-endian. A file is usable only if every check passes; the check that fails
// classifies it (see BlockFileStatus), and the cache removes it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kv/geometry.h"

namespace cedar::kv {

inline constexpr uint32_t kBlockFileVersion = 1;
inline constexpr size_t kBlockFileHeaderBytes = 128;
inline constexpr uint32_t kBlockFileZstd = 1u;

struct BlockFileHeader {
  uint32_t format_version = kBlockFileVersion;
  uint64_t layout_fingerprint = 0;
  uint64_t chain_hash = 0;
  uint64_t uid = 0;
  uint64_t parent_uid = 0;
  uint32_t depth = 0;
  uint32_t block_tokens = 0;
  uint64_t boundary_state_bytes = 0;
  uint32_t flags = 0;
  uint64_t raw_payload_bytes = 0;
  uint64_t stored_payload_bytes = 0;
  uint64_t body_checksum = 0;

  uint64_t body_bytes() const { return uint64_t{block_tokens} * 4 + boundary_state_bytes + stored_payload_bytes; }
  uint64_t file_bytes() const { return kBlockFileHeaderBytes + body_bytes(); }
};

// Byte offsets of the header fields (for tests that damage each one).
struct BlockFileField {
  const char* name;
  size_t offset;
  size_t size;
};
std::span<const BlockFileField> block_file_fields();

enum class BlockFileStatus {
  kOk,
  kForeign,    // not a cedar block file, or one written for another model / cache layout
  kStale,      // a cedar block file of another format version
  kCorrupt,    // checksum mismatch, inconsistent fields, undecodable payload, extra bytes
  kTruncated,  // shorter than its header says
};
const char* block_file_status_name(BlockFileStatus s);

struct BlockFileCheck {
  BlockFileStatus status = BlockFileStatus::kOk;
  std::string reason;  // which check failed, for the log line
  bool ok() const { return status == BlockFileStatus::kOk; }
};

// Serialises one block; fills the checksums and the stored payload fields of `header`.
// zstd_level > 0 compresses the payload, kept only when it is smaller than the raw bytes.
std::vector<uint8_t> encode_block_file(BlockFileHeader header, std::span<const int32_t> tokens,
                                       std::span<const uint8_t> boundary_state, std::span<const uint8_t> kv,
                                       int zstd_level);

// Checks a header (the first kBlockFileHeaderBytes of a file of `file_size` bytes) against the cache
// layout: magic, version, header checksum, fingerprint, geometry fields, and the size.
BlockFileCheck parse_block_header(std::span<const uint8_t> bytes, uint64_t file_size, const CacheGeometry& g,
                                  BlockFileHeader* out);

// Checks a whole file and decodes its body: tokens into `tokens` (block_tokens), the boundary state
// and the raw KV payload (block_bytes) into the given buffers.
BlockFileCheck decode_block_file(std::span<const uint8_t> file, const CacheGeometry& g, BlockFileHeader* header,
                                 std::span<int32_t> tokens, std::span<uint8_t> boundary_state,
                                 std::span<uint8_t> kv);

}  // namespace cedar::kv
