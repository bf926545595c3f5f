// Content-addressed prefix index: chained hashing, exact token comparison on hits (forced collisions),
// reference counting of indexed blocks, eviction of unused leaves.
#include "kv/prefix_index.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <numeric>

#include "kv_test_util.h"

namespace cedar::kv {
namespace {

using testing::tiny_geometry;

uint64_t constant_hash(uint64_t, std::span<const int32_t>) { return 42; }

std::vector<int32_t> tokens_of(std::initializer_list<int32_t> t) { return t; }

TEST(PrefixIndex, ChainHashIsXxh3SeededWithTheParent) {
  const std::vector<int32_t> t = {5, 6, 7, 8, 9, 10, 11, 12};
  const uint64_t root = chain_root_hash(123);
  EXPECT_EQ(root, XXH3_64bits(std::vector<uint64_t>{123}.data(), 8));
  const auto h = chain_hashes(t, 4, 2, root);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0], XXH3_64bits_withSeed(t.data(), 16, root));
  EXPECT_EQ(h[1], XXH3_64bits_withSeed(t.data() + 4, 16, h[0]));
  // The same block after a different first block hashes differently; so does another model.
  const std::vector<int32_t> u = {1, 6, 7, 8, 9, 10, 11, 12};
  EXPECT_NE(chain_hashes(u, 4, 2, root)[1], h[1]);
  EXPECT_NE(chain_hashes(t, 4, 2, chain_root_hash(124))[0], h[0]);
}

class PrefixIndexTest : public ::testing::Test {
 protected:
  void SetUp() override { pool_ = BlockPool::create(tiny_geometry(4), 16).value(); }
  BlockId fresh() { return pool_->allocate().value(); }
  std::unique_ptr<BlockPool> pool_;
};

TEST_F(PrefixIndexTest, LongestPrefixInWholeBlocks) {
  PrefixIndex index(*pool_, 99);
  const auto t = tokens_of({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  const auto h = chain_hashes(t, 4, 2, index.root_hash());
  const BlockId b0 = fresh(), b1 = fresh();
  const auto n0 = index.insert(PrefixIndex::kRoot, h[0], std::span(t).first(4), b0);
  index.insert(n0, h[1], std::span(t).subspan(4, 4), b1);
  EXPECT_EQ(pool_->refcount(b0), 2u);  // the allocation plus the index

  auto m = index.lookup(t, h, 10);
  EXPECT_EQ(m.blocks, (std::vector<BlockId>{b0, b1}));
  EXPECT_EQ(index.lookup(t, h, 1).blocks.size(), 1u);  // capped by max_blocks

  auto other = tokens_of({1, 2, 3, 4, 5, 6, 7, 0});  // diverges in block 1
  EXPECT_EQ(index.lookup(other, chain_hashes(other, 4, 2, index.root_hash()), 2).blocks,
            (std::vector<BlockId>{b0}));
}

TEST_F(PrefixIndexTest, ForcedCollisionsNeverConfuseTwoPrefixes) {
  // Every block of every prefix hashes to 42: only the parent link and the token comparison separate them.
  PrefixIndex index(*pool_, 99, constant_hash);
  const auto a = tokens_of({1, 1, 1, 1, 2, 2, 2, 2});
  const auto c = tokens_of({3, 3, 3, 3, 2, 2, 2, 2});  // same second block, different first
  const auto ha = chain_hashes(a, 4, 2, index.root_hash(), constant_hash);
  const auto hc = chain_hashes(c, 4, 2, index.root_hash(), constant_hash);
  EXPECT_EQ(ha, hc);
  const BlockId a0 = fresh(), a1 = fresh();
  const auto na0 = index.insert(PrefixIndex::kRoot, ha[0], std::span(a).first(4), a0);
  index.insert(na0, ha[1], std::span(a).subspan(4), a1);

  EXPECT_TRUE(index.lookup(c, hc, 2).blocks.empty()) << "c's first block differs from a's";
  const BlockId c0 = fresh(), c1 = fresh();
  const auto nc0 = index.insert(PrefixIndex::kRoot, hc[0], std::span(c).first(4), c0);
  const auto nc1 = index.insert(nc0, hc[1], std::span(c).subspan(4), c1);
  EXPECT_NE(nc0, na0);
  EXPECT_EQ(index.lookup(c, hc, 2).blocks, (std::vector<BlockId>{c0, c1}));
  EXPECT_EQ(index.lookup(a, ha, 2).blocks, (std::vector<BlockId>{a0, a1}));
  EXPECT_GT(index.stats().hash_collisions, 0u);
  EXPECT_EQ(index.block_of(nc1), c1);
  // Re-inserting a's content returns the existing entry and takes no new reference.
  const BlockId dup = fresh();
  EXPECT_EQ(index.insert(PrefixIndex::kRoot, ha[0], std::span(a).first(4), dup), na0);
  EXPECT_EQ(pool_->refcount(dup), 1u);
  EXPECT_EQ(index.stats().duplicates, 1u);
}

TEST_F(PrefixIndexTest, EvictsOnlyUnusedLeavesOldestFirst) {
  PrefixIndex index(*pool_, 99);
  const auto a = tokens_of({1, 1, 1, 1, 2, 2, 2, 2});
  const auto b = tokens_of({5, 5, 5, 5});
  const auto ha = chain_hashes(a, 4, 2, index.root_hash());
  const auto hb = chain_hashes(b, 4, 1, index.root_hash());
  const BlockId a0 = fresh(), a1 = fresh(), b0 = fresh();
  const auto na0 = index.insert(PrefixIndex::kRoot, ha[0], std::span(a).first(4), a0);
  index.insert(na0, ha[1], std::span(a).subspan(4), a1);
  index.insert(PrefixIndex::kRoot, hb[0], b, b0);
  // Sequences still hold a1 and b0; only the index holds a0 but it is not a leaf.
  pool_->release(a0);
  EXPECT_FALSE(index.evict_one());
  pool_->release(a1);  // a's tail is now index-only and is the oldest leaf
  pool_->release(b0);
  index.lookup(b, hb, 1);  // b used most recently
  EXPECT_TRUE(index.evict_one());
  EXPECT_EQ(pool_->refcount(a1), 0u);  // freed
  EXPECT_TRUE(index.evict_one());      // then a0, a leaf now and older than b
  EXPECT_EQ(pool_->refcount(a0), 0u);
  EXPECT_TRUE(index.lookup(a, ha, 2).blocks.empty());
  EXPECT_EQ(index.lookup(b, hb, 1).blocks.size(), 1u);
  EXPECT_TRUE(index.evict_one());
  EXPECT_FALSE(index.evict_one());
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(pool_->blocks_in_use(), 0u);
}

}  // namespace
}  // namespace cedar::kv
