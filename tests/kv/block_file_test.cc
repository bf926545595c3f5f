// Block file format: round trips (raw and zstd) and detection of every kind of damage: each header
// field, payload bytes, truncation at every length, trailing bytes, another model, another version.
#include "kv/block_file.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <random>

#include "kv_test_util.h"

namespace cedar::kv {
namespace {

using testing::tiny_geometry;

struct Block {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> boundary, kv;
};

Block random_block(const CacheGeometry& g, uint32_t seed) {
  std::mt19937 rng(seed);
  Block b;
  b.tokens.resize(g.block_tokens);
  for (auto& t : b.tokens) t = static_cast<int32_t>(rng() % 129280);
  b.boundary.resize(g.boundary_state_bytes);
  for (auto& x : b.boundary) x = static_cast<uint8_t>(rng());
  b.kv.resize(g.block_bytes);
  for (auto& x : b.kv) x = static_cast<uint8_t>(rng() % 7);  // compressible: zstd gets used
  return b;
}

BlockFileHeader header_for(const CacheGeometry& g) {
  BlockFileHeader h;
  h.layout_fingerprint = g.layout_fingerprint();
  h.chain_hash = 0x1234;
  h.uid = 77;
  h.parent_uid = 66;
  h.depth = 3;
  h.block_tokens = g.block_tokens;
  h.boundary_state_bytes = g.boundary_state_bytes;
  h.raw_payload_bytes = g.block_bytes;
  return h;
}

BlockFileCheck decode(const std::vector<uint8_t>& file, const CacheGeometry& g, Block* out = nullptr) {
  Block tmp;
  Block& b = out ? *out : tmp;
  b.tokens.assign(g.block_tokens, 0);
  b.boundary.assign(g.boundary_state_bytes, 0);
  b.kv.assign(g.block_bytes, 0);
  return decode_block_file(file, g, nullptr, b.tokens, b.boundary, b.kv);
}

TEST(BlockFile, RoundTripRawAndZstd) {
  const CacheGeometry g = tiny_geometry(16);
  const Block in = random_block(g, 1);
  for (int level : {0, 3}) {
    const auto file = encode_block_file(header_for(g), in.tokens, in.boundary, in.kv, level);
    BlockFileHeader h;
    ASSERT_TRUE(parse_block_header(file, file.size(), g, &h).ok());
    EXPECT_EQ(h.uid, 77u);
    EXPECT_EQ(h.parent_uid, 66u);
    EXPECT_EQ(h.depth, 3u);
    EXPECT_EQ(h.flags != 0, level > 0);
    const size_t raw_size = kBlockFileHeaderBytes + 16 * 4 + g.boundary_state_bytes + g.block_bytes;
    if (level > 0) {
      EXPECT_LT(file.size(), raw_size);
    } else {
      EXPECT_EQ(file.size(), raw_size);
    }
    Block out;
    ASSERT_TRUE(decode(file, g, &out).ok());
    EXPECT_EQ(out.tokens, in.tokens);
    EXPECT_EQ(out.boundary, in.boundary);
    EXPECT_EQ(out.kv, in.kv);
  }
}

TEST(BlockFile, HeaderLayoutIsTheDocumentedOne) {
  const CacheGeometry g = tiny_geometry(4);
  const Block in = random_block(g, 2);
  const auto f = encode_block_file(header_for(g), in.tokens, in.boundary, in.kv, 0);
  EXPECT_EQ(std::memcmp(f.data(), "CEDARKVB", 8), 0);
  uint64_t v;
  std::memcpy(&v, f.data() + 32, 8);
  EXPECT_EQ(v, 77u);  // uid
  std::memcpy(&v, f.data() + 120, 8);
  EXPECT_EQ(v, XXH3_64bits(f.data(), 120));  // header checksum
  std::memcpy(&v, f.data() + 88, 8);
  EXPECT_EQ(v, XXH3_64bits(f.data() + 128, f.size() - 128));  // body checksum
  // The fields table covers the header exactly, without gaps.
  size_t next = 0;
  for (const BlockFileField& field : block_file_fields()) {
    EXPECT_EQ(field.offset, next) << field.name;
    next = field.offset + field.size;
  }
  EXPECT_EQ(next, kBlockFileHeaderBytes);
}

TEST(BlockFile, EveryHeaderFieldFlipIsDetected) {
  const CacheGeometry g = tiny_geometry(4);
  const Block in = random_block(g, 3);
  const auto good = encode_block_file(header_for(g), in.tokens, in.boundary, in.kv, 0);
  for (const BlockFileField& field : block_file_fields()) {
    for (size_t i = 0; i < field.size; ++i) {
      for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
        auto bad = good;
        bad[field.offset + i] ^= mask;
        const BlockFileCheck c = parse_block_header(bad, bad.size(), g, nullptr);
        EXPECT_FALSE(c.ok()) << field.name << " byte " << i;
        const BlockFileStatus want = field.offset == 0        ? BlockFileStatus::kForeign
                                     : field.offset == 8      ? BlockFileStatus::kStale
                                                              : BlockFileStatus::kCorrupt;
        EXPECT_EQ(c.status, want) << field.name << " byte " << i << ": " << c.reason;
      }
    }
  }
}

TEST(BlockFile, EveryBodyByteFlipIsDetected) {
  const CacheGeometry g = tiny_geometry(4);
  const Block in = random_block(g, 4);
  for (int level : {0, 3}) {
    const auto good = encode_block_file(header_for(g), in.tokens, in.boundary, in.kv, level);
    for (size_t off = kBlockFileHeaderBytes; off < good.size(); ++off) {
      auto bad = good;
      bad[off] ^= 0x10;
      ASSERT_TRUE(parse_block_header(bad, bad.size(), g, nullptr).ok());  // header intact
      const BlockFileCheck c = decode(bad, g);
      ASSERT_EQ(c.status, BlockFileStatus::kCorrupt) << "byte " << off;
    }
  }
}

TEST(BlockFile, TruncationAtEveryLengthAndTrailingBytes) {
  const CacheGeometry g = tiny_geometry(4);
  const Block in = random_block(g, 5);
  const auto good = encode_block_file(header_for(g), in.tokens, in.boundary, in.kv, 0);
  for (size_t n = 0; n < good.size(); ++n) {
    const std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<ptrdiff_t>(n));
    const BlockFileCheck c = decode(cut, g);
    ASSERT_FALSE(c.ok()) << n;
    // Too short to hold the magic reads as not ours; otherwise it is a cut-short cedar file.
    if (n >= 12) {
      ASSERT_EQ(c.status, BlockFileStatus::kTruncated) << n << ": " << c.reason;
    }
  }
  auto longer = good;
  longer.push_back(0);
  EXPECT_EQ(decode(longer, g).status, BlockFileStatus::kCorrupt);
}

TEST(BlockFile, ForeignModelAndOtherVersion) {
  const CacheGeometry g = tiny_geometry(4, /*fingerprint=*/7);
  const CacheGeometry other = tiny_geometry(4, /*fingerprint=*/8);
  const Block in = random_block(g, 6);
  const auto file = encode_block_file(header_for(other), in.tokens, in.boundary, in.kv, 0);
  EXPECT_EQ(parse_block_header(file, file.size(), g, nullptr).status, BlockFileStatus::kForeign);
  // A well-formed file of another format version is stale, whatever the rest says.
  BlockFileHeader v2 = header_for(g);
  v2.format_version = kBlockFileVersion + 1;
  const auto newer = encode_block_file(v2, in.tokens, in.boundary, in.kv, 0);
  EXPECT_EQ(parse_block_header(newer, newer.size(), g, nullptr).status, BlockFileStatus::kStale);
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '!', '!'};
  EXPECT_EQ(parse_block_header(text, text.size(), g, nullptr).status, BlockFileStatus::kForeign);
}

}  // namespace
}  // namespace cedar::kv
