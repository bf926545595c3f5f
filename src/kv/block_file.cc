#include "kv/block_file.h"

#include <xxhash.h>
#include <zstd.h>

#include <bit>
#include <cstring>

#include "core/check.h"
#include "kv/byte_fields.h"

namespace cedar::kv {

static_assert(std::endian::native == std::endian::little, "block files are little-endian; add byte swaps");

namespace {

constexpr char kMagic[8] = {'C', 'E', 'D', 'A', 'R', 'K', 'V', 'B'};
constexpr size_t kHeaderChecksumOffset = 120;

constexpr BlockFileField kFields[] = {
    {"magic", 0, 8},
    {"format_version", 8, 4},
    {"header_bytes", 12, 4},
    {"layout_fingerprint", 16, 8},
    {"chain_hash", 24, 8},
    {"uid", 32, 8},
    {"parent_uid", 40, 8},
    {"depth", 48, 4},
    {"block_tokens", 52, 4},
    {"boundary_state_bytes", 56, 8},
    {"flags", 64, 4},
    {"reserved0", 68, 4},
    {"raw_payload_bytes", 72, 8},
    {"stored_payload_bytes", 80, 8},
    {"body_checksum", 88, 8},
    {"reserved1", 96, 24},
    {"header_checksum", 120, 8},
};


BlockFileCheck fail(BlockFileStatus s, std::string reason) { return {s, std::move(reason)}; }

}  // namespace

std::span<const BlockFileField> block_file_fields() { return kFields; }

const char* block_file_status_name(BlockFileStatus s) {
  switch (s) {
    case BlockFileStatus::kOk: return "ok";
    case BlockFileStatus::kForeign: return "foreign";
    case BlockFileStatus::kStale: return "stale";
    case BlockFileStatus::kCorrupt: return "corrupt";
    case BlockFileStatus::kTruncated: return "truncated";
  }
  return "?";
}

std::vector<uint8_t> encode_block_file(BlockFileHeader h, std::span<const int32_t> tokens,
                                       std::span<const uint8_t> boundary_state, std::span<const uint8_t> kv,
                                       int zstd_level) {
  CEDAR_CHECK(tokens.size() == h.block_tokens && boundary_state.size() == h.boundary_state_bytes &&
                  kv.size() == h.raw_payload_bytes,
              "encode_block_file: sizes disagree with the header");
  std::vector<uint8_t> compressed;  // [<= ZSTD_compressBound(block_bytes)] zstd frame of the payload
  h.flags = 0;
  h.stored_payload_bytes = kv.size();
  if (zstd_level > 0 && !kv.empty()) {
    compressed.resize(ZSTD_compressBound(kv.size()));
    const size_t n = ZSTD_compress(compressed.data(), compressed.size(), kv.data(), kv.size(), zstd_level);
    if (!ZSTD_isError(n) && n < kv.size()) {
      compressed.resize(n);
      h.flags = kBlockFileZstd;
      h.stored_payload_bytes = n;
    }
  }
  std::vector<uint8_t> out(h.file_bytes(), 0);  // [file_bytes] header | tokens | boundary | payload
  uint8_t* body = out.data() + kBlockFileHeaderBytes;
  std::memcpy(body, tokens.data(), tokens.size_bytes());
  std::memcpy(body + tokens.size_bytes(), boundary_state.data(), boundary_state.size());
  const uint8_t* payload = h.flags & kBlockFileZstd ? compressed.data() : kv.data();
  std::memcpy(body + tokens.size_bytes() + boundary_state.size(), payload, h.stored_payload_bytes);
  h.body_checksum = XXH3_64bits(body, h.body_bytes());

  uint8_t* p = out.data();
  std::memcpy(p, kMagic, 8);
  put_field<uint32_t>(p, 8, h.format_version);
  put_field<uint32_t>(p, 12, static_cast<uint32_t>(kBlockFileHeaderBytes));
  put_field<uint64_t>(p, 16, h.layout_fingerprint);
  put_field<uint64_t>(p, 24, h.chain_hash);
  put_field<uint64_t>(p, 32, h.uid);
  put_field<uint64_t>(p, 40, h.parent_uid);
  put_field<uint32_t>(p, 48, h.depth);
  put_field<uint32_t>(p, 52, h.block_tokens);
  put_field<uint64_t>(p, 56, h.boundary_state_bytes);
  put_field<uint32_t>(p, 64, h.flags);
  put_field<uint64_t>(p, 72, h.raw_payload_bytes);
  put_field<uint64_t>(p, 80, h.stored_payload_bytes);
  put_field<uint64_t>(p, 88, h.body_checksum);
  put_field<uint64_t>(p, kHeaderChecksumOffset, XXH3_64bits(p, kHeaderChecksumOffset));
  return out;
}

BlockFileCheck parse_block_header(std::span<const uint8_t> bytes, uint64_t file_size, const CacheGeometry& g,
                                  BlockFileHeader* out) {
  if (bytes.size() < 12 || std::memcmp(bytes.data(), kMagic, 8) != 0)
    return fail(BlockFileStatus::kForeign, "not a cedar KV block file (bad magic)");
  const uint8_t* p = bytes.data();
  // The version is checked before anything else is interpreted: another version may lay out the
  // header differently.
  const uint32_t version = get_field<uint32_t>(p, 8);
  if (version != kBlockFileVersion)
    return fail(BlockFileStatus::kStale,
                "format version " + std::to_string(version) + ", this build reads " + std::to_string(kBlockFileVersion));
  if (bytes.size() < kBlockFileHeaderBytes) return fail(BlockFileStatus::kTruncated, "shorter than its header");
  if (get_field<uint64_t>(p, kHeaderChecksumOffset) != XXH3_64bits(p, kHeaderChecksumOffset))
    return fail(BlockFileStatus::kCorrupt, "header checksum mismatch");
  BlockFileHeader h;
  h.format_version = version;
  h.layout_fingerprint = get_field<uint64_t>(p, 16);
  h.chain_hash = get_field<uint64_t>(p, 24);
  h.uid = get_field<uint64_t>(p, 32);
  h.parent_uid = get_field<uint64_t>(p, 40);
  h.depth = get_field<uint32_t>(p, 48);
  h.block_tokens = get_field<uint32_t>(p, 52);
  h.boundary_state_bytes = get_field<uint64_t>(p, 56);
  h.flags = get_field<uint32_t>(p, 64);
  h.raw_payload_bytes = get_field<uint64_t>(p, 72);
  h.stored_payload_bytes = get_field<uint64_t>(p, 80);
  h.body_checksum = get_field<uint64_t>(p, 88);
  if (h.layout_fingerprint != g.layout_fingerprint())
    return fail(BlockFileStatus::kForeign, "written for another model or cache layout (fingerprint mismatch)");
  // The fingerprint covers the geometry, so from here on a disagreement means damage.
  if (get_field<uint32_t>(p, 12) != kBlockFileHeaderBytes) return fail(BlockFileStatus::kCorrupt, "bad header_bytes");
  if (h.uid == 0) return fail(BlockFileStatus::kCorrupt, "uid is 0");
  if ((h.depth == 0) != (h.parent_uid == 0)) return fail(BlockFileStatus::kCorrupt, "depth and parent disagree");
  if (h.block_tokens != g.block_tokens || h.boundary_state_bytes != g.boundary_state_bytes ||
      h.raw_payload_bytes != g.block_bytes)
    return fail(BlockFileStatus::kCorrupt, "block geometry fields disagree with the fingerprint");
  if (h.flags & ~kBlockFileZstd) return fail(BlockFileStatus::kCorrupt, "unknown flag bits");
  if (!(h.flags & kBlockFileZstd) && h.stored_payload_bytes != h.raw_payload_bytes)
    return fail(BlockFileStatus::kCorrupt, "uncompressed payload size mismatch");
  if (h.stored_payload_bytes > ZSTD_compressBound(h.raw_payload_bytes))
    return fail(BlockFileStatus::kCorrupt, "stored payload size out of range");
  for (size_t off = 68; off < 72; ++off)
    if (p[off]) return fail(BlockFileStatus::kCorrupt, "reserved bytes set");
  for (size_t off = 96; off < kHeaderChecksumOffset; ++off)
    if (p[off]) return fail(BlockFileStatus::kCorrupt, "reserved bytes set");
  if (file_size < h.file_bytes())
    return fail(BlockFileStatus::kTruncated, std::to_string(file_size) + " bytes, header says " +
                                                 std::to_string(h.file_bytes()));
  if (file_size > h.file_bytes())
    return fail(BlockFileStatus::kCorrupt, std::to_string(file_size - h.file_bytes()) + " trailing bytes");
  if (out) *out = h;
  return {};
}

BlockFileCheck decode_block_file(std::span<const uint8_t> file, const CacheGeometry& g, BlockFileHeader* header,
                                 std::span<int32_t> tokens, std::span<uint8_t> boundary_state,
                                 std::span<uint8_t> kv) {
  BlockFileHeader h;
  BlockFileCheck c = parse_block_header(file, file.size(), g, &h);
  if (!c.ok()) return c;
  CEDAR_CHECK(tokens.size() == h.block_tokens && boundary_state.size() == h.boundary_state_bytes &&
                  kv.size() == h.raw_payload_bytes,
              "decode_block_file: output buffers do not match the geometry");
  const uint8_t* body = file.data() + kBlockFileHeaderBytes;
  if (XXH3_64bits(body, h.body_bytes()) != h.body_checksum)
    return fail(BlockFileStatus::kCorrupt, "body checksum mismatch");
  std::memcpy(tokens.data(), body, tokens.size_bytes());
  std::memcpy(boundary_state.data(), body + tokens.size_bytes(), boundary_state.size());
  const uint8_t* payload = body + tokens.size_bytes() + boundary_state.size();
  if (h.flags & kBlockFileZstd) {
    const size_t n = ZSTD_decompress(kv.data(), kv.size(), payload, h.stored_payload_bytes);
    if (ZSTD_isError(n) || n != kv.size())
      return fail(BlockFileStatus::kCorrupt, "zstd payload does not decode to the block size");
  } else {
    std::memcpy(kv.data(), payload, kv.size());
  }
  if (header) *header = h;
  return {};
}

}  // namespace cedar::kv
