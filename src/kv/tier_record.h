// The shared tier's keys and values: what cedar replicas store in Redis (redis_tier.h) so that one
// replica's prefix is another's cache hit.
//
// Keys: cedar:kv:v<version>:<layout fingerprint>:b:<chain hash>   a whole block of global KV (a string)
//       cedar:kv:v<version>:<layout fingerprint>:t:<prefix digest> the tails (partial last blocks) that
//                                                                 start after that prefix (a hash:
//                                                                 field = the tail's length)
// The layout fingerprint (CacheGeometry::layout_fingerprint) covers the model fingerprint and the
// cache layout, so other models, checkpoints or formats never look at each other's keys. A block's
// key is the chain hash of the prefix index (prefix_index.h); a tail hash's the 128-bit digest of
// every token before the tails (prefix_digests below), so one lookup can ask for the tails at any
// block boundary without knowing their tokens. Version 2: tails became hashes.
//
// Values (little-endian), one record per key:
//    0  8  magic "CEDARKVR"
//    8  4  format_version (kTierRecordVersion)
//   12  4  kind (1 block, 2 tail)
//   16  8  layout_fingerprint
//   24  8  chain_hash         blocks: the chain hash through this block; tails: 0
//   32 16  prefix_digest      XXH3-128 (lo, hi) of tokens [0, start + n_tokens), seeded by the layout
//   48  8  start              first token of the record (a multiple of block_tokens)
//   56  4  n_tokens           block_tokens for a block, 1 .. block_tokens-1 for a tail
//   60  4  reserved (0)
//   64  8  boundary_bytes     blocks: CacheGeometry::boundary_state_bytes; tails: 0
//   72  8  payload_bytes      blocks: block_bytes; tails: TailCache::payload_bytes(n_tokens)
//   80  8  body_checksum      XXH3-64 of the body
//   88  8  header_checksum    XXH3-64 of bytes [0, 88)
//   then: boundary state | payload (raw KV entries).
// A record is used only when every field and both checksums agree with what the lookup expects. The
// token ids themselves are not stored (they would add 4 bytes per token, 0.45 % of V4.1's 890 and 3.8 %
// of cedar-mini's 106): the 128-bit prefix digest names every token up to the record's end, so a record
// of another prefix (a 64-bit chain-hash collision, a key written for other content) is refused. A
// value that fails is classified (TierRecordStatus) and the caller deletes its key.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kv/geometry.h"

namespace cedar::kv {

inline constexpr uint32_t kTierRecordVersion = 2;
inline constexpr size_t kTierRecordHeaderBytes = 96;

enum class TierRecordKind : uint32_t { kBlock = 1, kTail = 2 };

struct PrefixDigest {
  uint64_t lo = 0, hi = 0;
  bool operator==(const PrefixDigest&) const = default;
};

// Digests of tokens[0, e) for every e in `ends` (ascending), seeded with the layout fingerprint, in one
// pass over the tokens.
std::vector<PrefixDigest> prefix_digests(std::span<const int32_t> tokens, std::span<const int64_t> ends,
                                         uint64_t layout_fingerprint);

// "cedar:kv:v1:<16 hex>:" : every key of one model and layout starts with it.
std::string tier_key_prefix(uint64_t layout_fingerprint);
std::string tier_block_key(uint64_t layout_fingerprint, uint64_t chain_hash);
// The tails after the prefix `digest` names ([0, start)).
std::string tier_tail_key(uint64_t layout_fingerprint, const PrefixDigest& digest);

// What a lookup expects a record to be.
struct TierRecordIdentity {
  TierRecordKind kind = TierRecordKind::kBlock;
  uint64_t chain_hash = 0;  // blocks only
  PrefixDigest digest;      // of [0, start + tokens.size())
  int64_t start = 0;
  std::span<const int32_t> tokens;  // the record's own tokens (their count is checked; the digest names them)
};

std::vector<uint8_t> encode_tier_record(const CacheGeometry& g, const TierRecordIdentity& id,
                                        std::span<const uint8_t> boundary, std::span<const uint8_t> payload);

enum class TierRecordStatus {
  kOk,
  kForeign,   // not a cedar record, or another model / cache layout
  kStale,     // another format version
  kCorrupt,   // checksum, size or field mismatch
  kMismatch,  // a sound record of other tokens (a hash collision or a key written for other content)
};
const char* tier_record_status_name(TierRecordStatus s);

struct TierRecordCheck {
  TierRecordStatus status = TierRecordStatus::kOk;
  std::string reason;
  bool ok() const { return status == TierRecordStatus::kOk; }
};

// Checks `value` against the layout and the expected identity; on success the boundary state and the
// payload are views into `value`.
TierRecordCheck decode_tier_record(std::span<const uint8_t> value, const CacheGeometry& g,
                                   const TierRecordIdentity& expect, std::span<const uint8_t>* boundary,
                                   std::span<const uint8_t>* payload);

}  // namespace cedar::kv
