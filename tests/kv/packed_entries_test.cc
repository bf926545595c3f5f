// The cache stores the packed formats of ops/formats/quant.h; what comes back out of it -- from memory, or from
// disk after a restart -- must dequantise to exactly the QDQ values the reference attends to (spec §5.1:
// its caches hold bf16 QDQ-simulated values).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kv/disk_cache.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"
#include "ops/formats/formats.h"
#include "ops/formats/quant.h"

namespace cedar::kv {
namespace {

using testing::fresh_temp_dir;
using testing::v41_spec;

// A bf16 "latent": gaussian values with per-block magnitudes from tiny to large, and some exact zeros.
std::vector<float> random_latent(std::mt19937& rng, size_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; i += 16) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    for (size_t k = i; k < i + 16; ++k) x[k] = ops::round_bf16(normal(rng) * scale);
  }
  x[rng() % n] = 0.0f;
  return x;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(PackedEntries, CacheRoundTripIsTheReferenceQdqBitForBit) {
  const CacheGeometry g = make_cache_geometry(v41_spec(), 4, 40).value();
  ASSERT_EQ(g.owners[0].main_entry_bytes, ops::kMainKvEntryBytes);
  ASSERT_EQ(g.owners[0].index_entry_bytes, ops::kIndexKeyEntryBytes);
  ASSERT_EQ(g.window_entry_bytes, ops::kWindowKvEntryBytes);
  const std::string dir = fresh_temp_dir("packed");
  std::mt19937 rng(2024);
  const std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  // Expected dequantised values per (owner, entry): main and index key.
  std::vector<std::vector<std::vector<float>>> want_main(g.owners.size()), want_index(g.owners.size());
  {
    auto disk = DiskPrefixCache::open(dir, g).value();
    KvCacheOptions o;
    o.capacity_blocks = 8;
    o.disk = disk.get();
    auto cache = KvCache::create(g, o).value();
    Sequence* s = cache->new_sequence().value();
    ASSERT_TRUE(cache->append(*s, prompt).ok());
    for (size_t o_i = 0; o_i < g.owners.size(); ++o_i) {
      const int o = static_cast<int>(o_i);
      for (int64_t j = 0; j < s->complete_entries(o); ++j) {
        const auto latent = random_latent(rng, ops::kMainKvDim);  // [512]
        ops::pack_main_kv_entry(latent.data(), s->main_entry_mut(o, j));
        auto qdq = latent;
        ops::fp4_qdq_e4m3_inplace(qdq.data(), qdq.size());
        want_main[o_i].push_back(qdq);
        const auto key = random_latent(rng, ops::kIndexKeyDim);  // [128]
        ops::pack_index_key_entry(key.data(), s->index_key_mut(o, j));
        auto key_qdq = key;
        ops::fp4_qdq_e8m0_inplace(key_qdq.data(), key_qdq.size());
        want_index[o_i].push_back(key_qdq);
      }
    }
    // Window entries (per sequence, not persisted): FP8 E4M3 with E8M0 scales per 32.
    for (int layer : {0, 20, 39, 42}) {
      const auto kv = random_latent(rng, ops::kWindowKvDim);  // [512]
      ops::pack_window_kv_entry(kv.data(), s->window_slot(layer, 8));
      auto qdq = kv;
      ops::act_qdq_fp8_inplace(qdq.data(), qdq.size());
      std::vector<float> back(ops::kWindowKvDim);  // [512]
      ops::unpack_window_kv_entry(s->window_slot(layer, 8), back.data());
      EXPECT_TRUE(bit_equal(back, qdq)) << "window layer " << layer;
    }
    for (size_t k = 0; k < 2; ++k) s->capture_boundary_state(k);
    ASSERT_TRUE(cache->commit(*s).ok());
    ASSERT_EQ(disk->stats().saved_blocks, 2u);
  }
  // "Restart": a new cache reads the two full blocks back from disk.
  auto disk = DiskPrefixCache::open(dir, g).value();
  KvCacheOptions o;
  o.capacity_blocks = 8;
  o.disk = disk.get();
  auto cache = KvCache::create(g, o).value();
  Sequence* s = cache->new_sequence().value();
  ASSERT_EQ(cache->attach_prefix(*s, prompt, 8).value(), 8);
  std::vector<float> main(ops::kMainKvDim);  // [512]
  std::vector<float> key(ops::kIndexKeyDim);  // [128]
  size_t checked = 0;
  for (size_t o_i = 0; o_i < g.owners.size(); ++o_i) {
    const int o = static_cast<int>(o_i);
    ASSERT_EQ(s->complete_entries(o), 8 / g.owners[o_i].ratio);
    for (int64_t j = 0; j < s->complete_entries(o); ++j) {
      ops::unpack_main_kv_entry(s->main_entry(o, j), main.data());
      EXPECT_TRUE(bit_equal(main, want_main[o_i][static_cast<size_t>(j)])) << "owner " << o << " entry " << j;
      ops::unpack_index_key_entry(s->index_key(o, j), key.data());
      EXPECT_TRUE(bit_equal(key, want_index[o_i][static_cast<size_t>(j)])) << "owner " << o << " key " << j;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3u * 4u + 8u);  // 3 ratio-2 owners x 4 entries + the ratio-1 owner x 8
}

}  // namespace
}  // namespace cedar::kv
