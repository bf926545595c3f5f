// The shared tier's records and keys (kv/tier_record.h): the documented byte layout, round trips,
// every single-byte change and every truncation refused, other models / versions / prefixes refused;
// the redis:// URL parser; a tier whose Redis is down answers misses at once and drops writes.
#include "kv/tier_record.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <random>

#include "kv/prefix_index.h"
#include "kv/redis_tier.h"
#include "kv/tail_cache.h"
#include "kv_test_util.h"

namespace cedar::kv {
namespace {

using testing::tiny_geometry;

template <typename T>
T read_at(const std::vector<uint8_t>& v, size_t off) {
  T x;
  std::memcpy(&x, v.data() + off, sizeof(T));
  return x;
}

struct Fixture {
  CacheGeometry g = tiny_geometry(4, 7);
  std::vector<int32_t> tokens;        // a prompt of 3 blocks
  std::vector<uint8_t> boundary, kv;  // block 1's
  std::vector<uint64_t> hashes;
  std::vector<PrefixDigest> digests;  // of [0, 4), [0, 8), [0, 12)

  Fixture() {
    std::mt19937 rng(5);
    for (int i = 0; i < 12; ++i) tokens.push_back(static_cast<int32_t>(rng() % 129280));
    boundary.resize(g.boundary_state_bytes);
    kv.resize(g.block_bytes);
    for (auto& b : boundary) b = static_cast<uint8_t>(rng());
    for (auto& b : kv) b = static_cast<uint8_t>(rng());
    hashes = chain_hashes(tokens, g.block_tokens, 3, chain_root_hash(g.layout_fingerprint()));
    const std::vector<int64_t> ends = {4, 8, 12};
    digests = prefix_digests(tokens, ends, g.layout_fingerprint());
  }
  TierRecordIdentity block(size_t k) const {
    TierRecordIdentity id;
    id.kind = TierRecordKind::kBlock;
    id.chain_hash = hashes[k];
    id.digest = digests[k];
    id.start = static_cast<int64_t>(k * g.block_tokens);
    id.tokens = std::span(tokens).subspan(k * g.block_tokens, g.block_tokens);
    return id;
  }
  std::vector<uint8_t> record() const { return encode_tier_record(g, block(1), boundary, kv); }
};

TEST(TierRecord, DigestsAreXxh3128OfEachPrefixSeededByTheLayout) {
  Fixture f;
  for (int e : {4, 8, 12}) {
    const XXH128_hash_t want = XXH3_128bits_withSeed(f.tokens.data(), e * sizeof(int32_t), f.g.layout_fingerprint());
    EXPECT_EQ(f.digests[e / 4 - 1].lo, want.low64);
    EXPECT_EQ(f.digests[e / 4 - 1].hi, want.high64);
  }
}

TEST(TierRecord, HeaderFollowsTheDocumentedLayout) {
  Fixture f;
  const std::vector<uint8_t> r = f.record();
  ASSERT_EQ(r.size(), kTierRecordHeaderBytes + f.boundary.size() + f.kv.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(r.data()), 8), "CEDARKVR");
  EXPECT_EQ(read_at<uint32_t>(r, 8), kTierRecordVersion);
  EXPECT_EQ(read_at<uint32_t>(r, 12), 1u);
  EXPECT_EQ(read_at<uint64_t>(r, 16), f.g.layout_fingerprint());
  EXPECT_EQ(read_at<uint64_t>(r, 24), f.hashes[1]);
  EXPECT_EQ(read_at<uint64_t>(r, 32), f.digests[1].lo);
  EXPECT_EQ(read_at<uint64_t>(r, 40), f.digests[1].hi);
  EXPECT_EQ(read_at<uint64_t>(r, 48), 4u);
  EXPECT_EQ(read_at<uint32_t>(r, 56), 4u);
  EXPECT_EQ(read_at<uint64_t>(r, 64), f.boundary.size());
  EXPECT_EQ(read_at<uint64_t>(r, 72), f.kv.size());
  EXPECT_EQ(read_at<uint64_t>(r, 80), XXH3_64bits(r.data() + 96, r.size() - 96));
  EXPECT_EQ(read_at<uint64_t>(r, 88), XXH3_64bits(r.data(), 88));
  EXPECT_EQ(std::memcmp(r.data() + 96, f.boundary.data(), f.boundary.size()), 0);
  EXPECT_EQ(std::memcmp(r.data() + 96 + f.boundary.size(), f.kv.data(), f.kv.size()), 0);
}

TEST(TierRecord, RoundTripGivesTheBytesBack) {
  Fixture f;
  const std::vector<uint8_t> r = f.record();
  std::span<const uint8_t> boundary, payload;
  const TierRecordCheck c = decode_tier_record(r, f.g, f.block(1), &boundary, &payload);
  ASSERT_TRUE(c.ok()) << c.reason;
  EXPECT_TRUE(std::equal(boundary.begin(), boundary.end(), f.boundary.begin(), f.boundary.end()));
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), f.kv.begin(), f.kv.end()));
}

TEST(TierRecord, EverySingleByteChangeIsRefused) {
  Fixture f;
  const std::vector<uint8_t> good = f.record();
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}}) {
      std::vector<uint8_t> bad = good;
      bad[i] ^= flip;
      EXPECT_FALSE(decode_tier_record(bad, f.g, f.block(1), nullptr, nullptr).ok()) << "byte " << i;
    }
  }
}

TEST(TierRecord, EveryTruncationAndTrailingBytesAreRefused) {
  Fixture f;
  const std::vector<uint8_t> good = f.record();
  for (size_t n = 0; n < good.size(); ++n) {
    const std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<ptrdiff_t>(n));
    EXPECT_FALSE(decode_tier_record(cut, f.g, f.block(1), nullptr, nullptr).ok()) << n << " bytes";
  }
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_EQ(decode_tier_record(longer, f.g, f.block(1), nullptr, nullptr).status, TierRecordStatus::kCorrupt);
}

TEST(TierRecord, AnotherModelOrVersionIsClassified) {
  Fixture f;
  const CacheGeometry other = tiny_geometry(4, 8);  // same layout, other model fingerprint
  ASSERT_NE(other.layout_fingerprint(), f.g.layout_fingerprint());
  const std::vector<uint8_t> foreign = encode_tier_record(other, f.block(1), f.boundary, f.kv);
  EXPECT_EQ(decode_tier_record(foreign, f.g, f.block(1), nullptr, nullptr).status, TierRecordStatus::kForeign);
  std::vector<uint8_t> stale = f.record();
  const uint32_t next = kTierRecordVersion + 1;
  std::memcpy(stale.data() + 8, &next, 4);
  const uint64_t hc = XXH3_64bits(stale.data(), 88);
  std::memcpy(stale.data() + 88, &hc, 8);
  EXPECT_EQ(decode_tier_record(stale, f.g, f.block(1), nullptr, nullptr).status, TierRecordStatus::kStale);
  std::vector<uint8_t> text(200, 'x');
  EXPECT_EQ(decode_tier_record(text, f.g, f.block(1), nullptr, nullptr).status, TierRecordStatus::kForeign);
}

TEST(TierRecord, ASoundRecordOfAnotherPrefixIsNeverUsed) {
  Fixture f;
  const std::vector<uint8_t> r = f.record();
  // The same block read as block 2, or behind other earlier tokens (same own tokens, other digest).
  EXPECT_EQ(decode_tier_record(r, f.g, f.block(2), nullptr, nullptr).status, TierRecordStatus::kMismatch);
  TierRecordIdentity id = f.block(1);
  id.digest.lo ^= 1;
  EXPECT_EQ(decode_tier_record(r, f.g, id, nullptr, nullptr).status, TierRecordStatus::kMismatch);
  id = f.block(1);
  id.chain_hash ^= 1;
  EXPECT_EQ(decode_tier_record(r, f.g, id, nullptr, nullptr).status, TierRecordStatus::kMismatch);
  id = f.block(1);
  id.start = 8;
  EXPECT_EQ(decode_tier_record(r, f.g, id, nullptr, nullptr).status, TierRecordStatus::kMismatch);
  // One token changed anywhere in the prefix, the record's own block or before it: another digest.
  for (size_t i = 0; i < 8; ++i) {
    std::vector<int32_t> other = f.tokens;
    other[i] += 1;
    const std::vector<int64_t> ends = {8};
    id = f.block(1);
    id.tokens = std::span(other).subspan(4, 4);
    id.digest = prefix_digests(other, ends, f.g.layout_fingerprint())[0];
    EXPECT_EQ(decode_tier_record(r, f.g, id, nullptr, nullptr).status, TierRecordStatus::kMismatch) << i;
  }
}

TEST(TierRecord, TailsRoundTripWithTheTailCachePayload) {
  Fixture f;
  for (int n = 1; n < static_cast<int>(f.g.block_tokens); ++n) {
    TierRecordIdentity id;
    id.kind = TierRecordKind::kTail;
    id.start = 8;
    id.tokens = std::span(f.tokens).subspan(8, static_cast<size_t>(n));
    const std::vector<int64_t> ends = {8 + n};
    id.digest = prefix_digests(f.tokens, ends, f.g.layout_fingerprint())[0];
    std::vector<uint8_t> payload(TailCache::payload_bytes(f.g, n));
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7 + n);
    const std::vector<uint8_t> r = encode_tier_record(f.g, id, {}, payload);
    std::span<const uint8_t> got;
    ASSERT_TRUE(decode_tier_record(r, f.g, id, nullptr, &got).ok()) << n;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), payload.begin(), payload.end()));
    TierRecordIdentity as_block = f.block(2);
    EXPECT_FALSE(decode_tier_record(r, f.g, as_block, nullptr, nullptr).ok());
  }
}

TEST(TierRecord, KeysNameTheVersionTheLayoutAndTheHash) {
  Fixture f;
  char want[80];
  std::snprintf(want, sizeof want, "cedar:kv:v2:%016llx:b:%016llx",
                static_cast<unsigned long long>(f.g.layout_fingerprint()),
                static_cast<unsigned long long>(f.hashes[0]));
  EXPECT_EQ(tier_block_key(f.g.layout_fingerprint(), f.hashes[0]), want);
  std::snprintf(want, sizeof want, "cedar:kv:v2:%016llx:t:%016llx%016llx",
                static_cast<unsigned long long>(f.g.layout_fingerprint()),
                static_cast<unsigned long long>(f.digests[0].hi), static_cast<unsigned long long>(f.digests[0].lo));
  EXPECT_EQ(tier_tail_key(f.g.layout_fingerprint(), f.digests[0]), want);
  EXPECT_NE(tier_key_prefix(tiny_geometry(4, 8).layout_fingerprint()), tier_key_prefix(f.g.layout_fingerprint()));
}

TEST(RedisUrl, ParsesHostPortDatabaseAndCredentials) {
  auto e = parse_redis_url("redis://cache.internal:6380/3");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "cache.internal");
  EXPECT_EQ(e->port, 6380);
  EXPECT_EQ(e->db, 3);
  EXPECT_TRUE(e->user.empty() && e->password.empty());
  e = parse_redis_url("redis://cedar:s3cr:et@10.0.0.2");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->user, "cedar");
  EXPECT_EQ(e->password, "s3cr:et");
  EXPECT_EQ(e->port, 6379);
  EXPECT_EQ(e->db, 0);
  EXPECT_EQ(e->redacted().find("s3cr"), std::string::npos);
  e = parse_redis_url("redis://[::1]:7000");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->port, 7000);
}

TEST(RedisUrl, RefusesTlsAndMalformedUrlsWithTheFix) {
  const auto tls = parse_redis_url("rediss://cache:6380");
  ASSERT_FALSE(tls.ok());
  EXPECT_NE(tls.status().message().find("TLS"), std::string::npos);
  for (const char* bad : {"http://cache:6379", "redis://", "redis://cache:0", "redis://cache:99999",
                          "redis://cache:port", "redis://cache:6379/x", "cache:6379"}) {
    const auto r = parse_redis_url(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) { EXPECT_NE(r.status().message().find("redis://"), std::string::npos) << bad; }
  }
}

TEST(RedisTierDown, MissesAtOnceDropsWritesAndCountsOneOutage) {
  Fixture f;
  RedisTierOptions o;
  o.url = "redis://127.0.0.1:1";  // nothing listens on port 1
  o.min_backoff_ms = 60000;       // no retry within the test
  auto tier = RedisTier::open(o, f.g);
  ASSERT_TRUE(tier.ok()) << tier.status().to_string();
  size_t calls = 0;
  std::vector<uint8_t> payload;
  const RedisTier::Found found = (*tier)->lookup(f.tokens, f.hashes, 0, static_cast<int64_t>(f.tokens.size()) - 1,
                                                 [&](size_t, std::span<const uint8_t>, std::span<const uint8_t>) {
                                                   ++calls;
                                                   return true;
                                                 },
                                                 &payload);
  EXPECT_EQ(found.blocks, 0u);
  EXPECT_EQ(found.tail_tokens, 0);
  EXPECT_EQ(calls, 0u);
  std::vector<RedisTier::Record> records;
  records.push_back({tier_block_key(f.g.layout_fingerprint(), f.hashes[1]), f.record()});
  (*tier)->save_async(std::move(records), {f.hashes[1]});
  EXPECT_TRUE((*tier)->flush(std::chrono::seconds(30)));
  const RedisTierStats s = (*tier)->stats();
  EXPECT_TRUE(s.configured);
  EXPECT_FALSE(s.up);
  EXPECT_EQ(s.outages, 1u);
  EXPECT_GE(s.errors, 1u);
  EXPECT_EQ(s.dropped_writes, 1u);
  EXPECT_EQ(s.written_records, 0u);
}

}  // namespace
}  // namespace cedar::kv
