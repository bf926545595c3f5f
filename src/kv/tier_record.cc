#include "kv/tier_record.h"

#include <xxhash.h>

#include <bit>
#include <cinttypes>
#include <cstring>

#include "core/check.h"
#include "kv/byte_fields.h"
#include "kv/tail_cache.h"

namespace cedar::kv {

static_assert(std::endian::native == std::endian::little, "tier records are little-endian; add byte swaps");

namespace {

constexpr char kMagic[8] = {'C', 'E', 'D', 'A', 'R', 'K', 'V', 'R'};
constexpr size_t kHeaderChecksumOffset = 88;


std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

TierRecordCheck fail(TierRecordStatus s, std::string reason) { return {s, std::move(reason)}; }

// What the record of this identity holds besides its tokens.
void expected_sizes(const CacheGeometry& g, const TierRecordIdentity& id, uint64_t* boundary, uint64_t* payload) {
  if (id.kind == TierRecordKind::kBlock) {
    *boundary = g.boundary_state_bytes;
    *payload = g.block_bytes;
  } else {
    *boundary = 0;
    *payload = TailCache::payload_bytes(g, static_cast<int64_t>(id.tokens.size()));
  }
}

}  // namespace

std::vector<PrefixDigest> prefix_digests(std::span<const int32_t> tokens, std::span<const int64_t> ends,
                                         uint64_t layout_fingerprint) {
  std::vector<PrefixDigest> out;
  out.reserve(ends.size());
  XXH3_state_t* state = XXH3_createState();
  CEDAR_CHECK(state != nullptr, "XXH3_createState: out of memory");
  XXH3_128bits_reset_withSeed(state, layout_fingerprint);
  int64_t done = 0;
  for (const int64_t e : ends) {
    CEDAR_CHECK(e >= done && e <= static_cast<int64_t>(tokens.size()),
                "prefix_digests: ends must ascend within the tokens");
    XXH3_128bits_update(state, tokens.data() + done, static_cast<size_t>(e - done) * sizeof(int32_t));
    done = e;
    const XXH128_hash_t h = XXH3_128bits_digest(state);
    out.push_back({h.low64, h.high64});
  }
  XXH3_freeState(state);
  return out;
}

std::string tier_key_prefix(uint64_t layout_fingerprint) {
  return "cedar:kv:v" + std::to_string(kTierRecordVersion) + ":" + hex64(layout_fingerprint) + ":";
}

std::string tier_block_key(uint64_t layout_fingerprint, uint64_t chain_hash) {
  return tier_key_prefix(layout_fingerprint) + "b:" + hex64(chain_hash);
}

std::string tier_tail_key(uint64_t layout_fingerprint, const PrefixDigest& digest) {
  return tier_key_prefix(layout_fingerprint) + "t:" + hex64(digest.hi) + hex64(digest.lo);
}

const char* tier_record_status_name(TierRecordStatus s) {
  switch (s) {
    case TierRecordStatus::kOk: return "ok";
    case TierRecordStatus::kForeign: return "foreign";
    case TierRecordStatus::kStale: return "stale";
    case TierRecordStatus::kCorrupt: return "corrupt";
    case TierRecordStatus::kMismatch: return "mismatch";
  }
  return "?";
}

std::vector<uint8_t> encode_tier_record(const CacheGeometry& g, const TierRecordIdentity& id,
                                        std::span<const uint8_t> boundary, std::span<const uint8_t> payload) {
  uint64_t want_boundary = 0, want_payload = 0;
  expected_sizes(g, id, &want_boundary, &want_payload);
  CEDAR_CHECK(boundary.size() == want_boundary && payload.size() == want_payload,
              "encode_tier_record: boundary/payload sizes disagree with the geometry");
  CEDAR_CHECK(id.kind == TierRecordKind::kBlock ? id.tokens.size() == g.block_tokens
                                                : !id.tokens.empty() && id.tokens.size() < g.block_tokens,
              "encode_tier_record: a block holds block_tokens tokens, a tail fewer");
  std::vector<uint8_t> out(kTierRecordHeaderBytes + boundary.size() + payload.size(), 0);
  uint8_t* body = out.data() + kTierRecordHeaderBytes;
  if (!boundary.empty()) std::memcpy(body, boundary.data(), boundary.size());
  if (!payload.empty()) std::memcpy(body + boundary.size(), payload.data(), payload.size());
  uint8_t* p = out.data();
  std::memcpy(p, kMagic, 8);
  put_field<uint32_t>(p, 8, kTierRecordVersion);
  put_field<uint32_t>(p, 12, static_cast<uint32_t>(id.kind));
  put_field<uint64_t>(p, 16, g.layout_fingerprint());
  put_field<uint64_t>(p, 24, id.kind == TierRecordKind::kBlock ? id.chain_hash : 0);
  put_field<uint64_t>(p, 32, id.digest.lo);
  put_field<uint64_t>(p, 40, id.digest.hi);
  put_field<uint64_t>(p, 48, static_cast<uint64_t>(id.start));
  put_field<uint32_t>(p, 56, static_cast<uint32_t>(id.tokens.size()));
  put_field<uint64_t>(p, 64, boundary.size());
  put_field<uint64_t>(p, 72, payload.size());
  put_field<uint64_t>(p, 80, XXH3_64bits(body, out.size() - kTierRecordHeaderBytes));
  put_field<uint64_t>(p, kHeaderChecksumOffset, XXH3_64bits(p, kHeaderChecksumOffset));
  return out;
}

TierRecordCheck decode_tier_record(std::span<const uint8_t> value, const CacheGeometry& g,
                                   const TierRecordIdentity& expect, std::span<const uint8_t>* boundary,
                                   std::span<const uint8_t>* payload) {
  if (value.size() < 12 || std::memcmp(value.data(), kMagic, 8) != 0)
    return fail(TierRecordStatus::kForeign, "not a cedar KV record (bad magic)");
  const uint8_t* p = value.data();
  // The version first: another version may lay the header out differently.
  const uint32_t version = get_field<uint32_t>(p, 8);
  if (version != kTierRecordVersion)
    return fail(TierRecordStatus::kStale, "format version " + std::to_string(version) + ", this build reads " +
                                              std::to_string(kTierRecordVersion));
  if (value.size() < kTierRecordHeaderBytes) return fail(TierRecordStatus::kCorrupt, "shorter than its header");
  if (get_field<uint64_t>(p, kHeaderChecksumOffset) != XXH3_64bits(p, kHeaderChecksumOffset))
    return fail(TierRecordStatus::kCorrupt, "header checksum mismatch");
  if (get_field<uint64_t>(p, 16) != g.layout_fingerprint())
    return fail(TierRecordStatus::kForeign, "written for another model or cache layout (fingerprint mismatch)");
  uint64_t want_boundary = 0, want_payload = 0;
  expected_sizes(g, expect, &want_boundary, &want_payload);
  const uint64_t n_tokens = get_field<uint32_t>(p, 56);
  const uint64_t boundary_bytes = get_field<uint64_t>(p, 64), payload_bytes = get_field<uint64_t>(p, 72);
  if (get_field<uint32_t>(p, 12) != static_cast<uint32_t>(expect.kind) || get_field<uint32_t>(p, 60) != 0)
    return fail(TierRecordStatus::kCorrupt, "kind or reserved field disagrees with the key");
  if (n_tokens != expect.tokens.size() || boundary_bytes != want_boundary || payload_bytes != want_payload)
    return fail(TierRecordStatus::kCorrupt, "sizes disagree with the cache layout");
  if (value.size() != kTierRecordHeaderBytes + boundary_bytes + payload_bytes)
    return fail(TierRecordStatus::kCorrupt,
                std::to_string(value.size()) + " bytes, the header says " +
                    std::to_string(kTierRecordHeaderBytes + boundary_bytes + payload_bytes));
  const uint8_t* body = p + kTierRecordHeaderBytes;
  if (XXH3_64bits(body, value.size() - kTierRecordHeaderBytes) != get_field<uint64_t>(p, 80))
    return fail(TierRecordStatus::kCorrupt, "body checksum mismatch");
  const uint64_t chain = expect.kind == TierRecordKind::kBlock ? expect.chain_hash : 0;
  if (get_field<uint64_t>(p, 24) != chain || get_field<uint64_t>(p, 32) != expect.digest.lo ||
      get_field<uint64_t>(p, 40) != expect.digest.hi || get_field<uint64_t>(p, 48) != static_cast<uint64_t>(expect.start))
    return fail(TierRecordStatus::kMismatch, "a sound record of another prefix");
  if (boundary) *boundary = std::span(body, boundary_bytes);
  if (payload) *payload = std::span(body + boundary_bytes, payload_bytes);
  return {};
}

}  // namespace cedar::kv
