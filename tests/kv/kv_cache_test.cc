// KvCache: prefix sharing, copy on write, truncation, eviction under pressure, and a randomized
// property test of the reference-count and content invariants against a simple model of what each
// sequence must read.
#include "kv/kv_cache.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "kv_test_util.h"

namespace cedar::kv {
namespace {

using testing::expect_content;
using testing::fake_forward;
using testing::iota_tokens;
using testing::marker;
using testing::tiny_geometry;


std::unique_ptr<KvCache> make_cache(uint32_t capacity_blocks, ChainHashFn hash = xxh3_chain_hash) {
  KvCacheOptions o;
  o.capacity_blocks = capacity_blocks;
  o.hash = hash;
  return KvCache::create(tiny_geometry(4), o).value();
}

// Runs a whole request: reuse the cached prefix, append the rest, "compute", commit.
Sequence* run_prompt(KvCache& cache, std::span<const int32_t> prompt) {
  Sequence* s = cache.new_sequence().value();
  const int64_t h = cache.attach_prefix(*s, prompt, static_cast<int64_t>(prompt.size()) - 1).value();
  EXPECT_TRUE(cache.append(*s, prompt.subspan(static_cast<size_t>(h))).ok());
  fake_forward(*s, h);
  EXPECT_TRUE(cache.commit(*s).ok());
  return s;
}

TEST(KvCache, SequencesSharingAPrefixShareItsBlocks) {
  auto cache = make_cache(32);
  const auto a = iota_tokens(11, 100);  // 2 full blocks + 3
  Sequence* s1 = run_prompt(*cache, a);
  auto b = a;
  b[9] = 7;  // diverges inside block 2
  Sequence* s2 = run_prompt(*cache, b);
  EXPECT_EQ(s2->reused_prefix_tokens(), 8);
  EXPECT_EQ(s2->block_table()[0], s1->block_table()[0]);
  EXPECT_EQ(s2->block_table()[1], s1->block_table()[1]);
  EXPECT_NE(s2->block_table()[2], s1->block_table()[2]);
  EXPECT_EQ(cache->pool().refcount(s1->block_table()[0]), 3u);  // two sequences + the index
  expect_content(*s1);
  expect_content(*s2);
  // Reusing a prefix restores the Engram history of its last block.
  EXPECT_EQ(std::vector<int64_t>(s2->engram_history().begin(), s2->engram_history().end()),
            (std::vector<int64_t>{b[10], b[9], b[8]}));  // s2's own state after its last token
  Sequence* s3 = cache->new_sequence().value();
  ASSERT_EQ(cache->attach_prefix(*s3, a, 10).value(), 8);
  EXPECT_EQ(std::vector<int64_t>(s3->engram_history().begin(), s3->engram_history().end()),
            (std::vector<int64_t>{a[7], a[6], a[5]}));
  EXPECT_EQ(cache->stats().reused_tokens_memory, 16u);
}

TEST(KvCache, EntriesOfABlockAreContiguousPerOwner) {
  auto cache = make_cache(8);
  Sequence* s = run_prompt(*cache, iota_tokens(9, 3));
  const CacheGeometry& g = cache->geometry();
  for (int o = 0; o < 2; ++o) {
    const OwnerGeometry& og = g.owners[o];
    for (size_t b = 0; b < 2; ++b) {
      for (uint32_t i = 0; i < og.entries_per_block; ++i) {
        const int64_t j = static_cast<int64_t>(b * og.entries_per_block + i);
        EXPECT_EQ(s->main_entry(o, j), s->main_entries_of_block(o, b) + i * og.main_entry_bytes);
        EXPECT_EQ(s->index_key(o, j), s->index_keys_of_block(o, b) + i * og.index_entry_bytes);
      }
    }
  }
  // Owners and components never overlap inside a block: the layout tiles block_bytes exactly.
  EXPECT_EQ(g.owners[0].index_offset, g.owners[0].main_offset + 2u * g.owners[0].main_entry_bytes);
  EXPECT_EQ(g.owners[1].main_offset, g.owners[0].index_offset + 2u * g.owners[0].index_entry_bytes);
  EXPECT_EQ(g.block_bytes, g.owners[1].index_offset + 4u * g.owners[1].index_entry_bytes);
}

TEST(KvCache, MaxTokensKeepsTheLastTokenForTheModel) {
  auto cache = make_cache(32);
  const auto a = iota_tokens(8, 1);
  cache->release(run_prompt(*cache, a));
  Sequence* s = cache->new_sequence().value();
  EXPECT_EQ(cache->attach_prefix(*s, a, 7).value(), 4);  // block 2 would cover the last token
  Sequence* t = cache->new_sequence().value();
  EXPECT_EQ(cache->attach_prefix(*t, a, 8).value(), 8);
  EXPECT_FALSE(cache->attach_prefix(*t, a, 8).ok());  // only into an empty sequence
}

TEST(KvCache, ForkCopiesTheSharedPartialBlockAtTheFirstDivergentWrite) {
  auto cache = make_cache(32);
  const auto a = iota_tokens(6, 1);  // block 1 is partial
  Sequence* parent = run_prompt(*cache, a);
  Sequence* child = cache->fork(*parent).value();
  EXPECT_EQ(child->block_table(), parent->block_table());
  EXPECT_EQ(cache->pool().refcount(parent->block_table()[1]), 2u);
  const BlockId shared = parent->block_table()[1];
  ASSERT_TRUE(cache->append(*child, std::vector<int32_t>{50}).ok());
  fake_forward(*child, 6);
  EXPECT_NE(child->block_table()[1], shared);
  EXPECT_EQ(parent->block_table()[1], shared);
  EXPECT_EQ(cache->pool().refcount(shared), 1u);
  EXPECT_EQ(cache->stats().pool.copies, 1u);
  ASSERT_TRUE(cache->append(*parent, std::vector<int32_t>{60}).ok());
  fake_forward(*parent, 6);
  EXPECT_EQ(parent->block_table()[1], shared);  // sole owner now: written in place
  expect_content(*parent);
  expect_content(*child);
}

TEST(KvCache, TruncateThenAppendCopiesAnIndexedBlock) {
  auto cache = make_cache(32);
  const auto a = iota_tokens(8, 1);
  Sequence* s = run_prompt(*cache, a);
  const BlockId indexed = s->block_table()[1];
  ASSERT_TRUE(cache->truncate(*s, 6).ok());
  EXPECT_EQ(s->n_tokens(), 6);
  ASSERT_TRUE(cache->append(*s, std::vector<int32_t>{9, 9}).ok());
  fake_forward(*s, 6);
  EXPECT_NE(s->block_table()[1], indexed);
  expect_content(*s);
  // The indexed version is untouched and still served.
  Sequence* t = cache->new_sequence().value();
  ASSERT_EQ(cache->attach_prefix(*t, a, 8).value(), 8);
  EXPECT_EQ(t->block_table()[1], indexed);
  expect_content(*t);
  EXPECT_FALSE(cache->truncate(*s, 9).ok());
}

TEST(KvCache, FullPoolEvictsIndexOnlyBlocksThenRefuses) {
  auto cache = make_cache(4);
  cache->release(run_prompt(*cache, iota_tokens(8, 1)));  // 2 blocks stay in the index
  EXPECT_EQ(cache->pool().blocks_in_use(), 2u);
  Sequence* s = cache->new_sequence().value();
  ASSERT_TRUE(cache->append(*s, iota_tokens(16, 500)).ok());  // needs all 4: evicts both
  EXPECT_EQ(cache->stats().index.evicted, 2u);
  Sequence* t = cache->new_sequence().value();
  const Status st = cache->append(*t, iota_tokens(1, 1));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("cache full"), std::string::npos);
  EXPECT_EQ(t->n_tokens(), 0);  // unchanged
  EXPECT_TRUE(t->block_table().empty());
}

TEST(KvCache, ForcedHashCollisionsStillReuseOnlyEqualPrefixes) {
  auto cache = make_cache(64, [](uint64_t, std::span<const int32_t>) -> uint64_t { return 7; });
  const auto a = iota_tokens(12, 1);
  auto b = a;
  b[0] = 99;  // different first block, identical later blocks
  Sequence* sa = run_prompt(*cache, a);
  Sequence* sb = run_prompt(*cache, b);
  EXPECT_EQ(sb->reused_prefix_tokens(), 0);
  auto c = a;
  c[6] = -5;
  Sequence* sc = run_prompt(*cache, c);
  EXPECT_EQ(sc->reused_prefix_tokens(), 4);
  expect_content(*sa);
  expect_content(*sb);
  expect_content(*sc);
  EXPECT_GT(cache->stats().index.hash_collisions, 0u);
}

// Random operations; after each one every block's reference count must equal the number of block
// tables listing it plus one if the index holds it, and every sequence must read its own content.
TEST(KvCache, RefcountAndCopyOnWriteProperty) {
  uint64_t copies = 0, evicted = 0, reused = 0, refused = 0;
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    std::mt19937 rng(seed);
    auto cache = make_cache(10 + seed % 6);
    std::vector<Sequence*> live;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> p(static_cast<size_t>(4 + rng() % 14));
      for (auto& x : p) x = static_cast<int32_t>(rng() % 3);  // small alphabet: lots of sharing
      prompts.push_back(p);
    }
    auto rnd = [&](size_t n) { return static_cast<size_t>(rng() % n); };
    for (int step = 0; step < 300; ++step) {
      const size_t op = rnd(7);
      if (op == 0 || live.empty()) {  // new request
        Sequence* s = cache->new_sequence().value();
        auto p = prompts[rnd(prompts.size())];
        p.resize(std::max<size_t>(1, rnd(p.size() + 1)));
        const int64_t h = cache->attach_prefix(*s, p, static_cast<int64_t>(p.size()) - 1).value();
        if (cache->append(*s, std::span(p).subspan(static_cast<size_t>(h))).ok()) {
          fake_forward(*s, h);
          live.push_back(s);
        } else {
          cache->release(s);
        }
      } else if (op == 1) {  // decode a few tokens
        Sequence* s = live[rnd(live.size())];
        const int64_t from = s->n_tokens();
        std::vector<int32_t> add(1 + rnd(5));
        for (auto& x : add) x = static_cast<int32_t>(rng() % 3);
        const auto before = s->block_table();
        const Status st = cache->append(*s, add);
        if (st.ok()) {
          fake_forward(*s, from);
        } else {
          ASSERT_EQ(st.code(), StatusCode::kResourceExhausted);
          ASSERT_EQ(s->n_tokens(), from);
          ASSERT_EQ(s->block_table(), before);
          ++refused;
        }
      } else if (op == 2) {
        Sequence* s = live[rnd(live.size())];
        auto f = cache->fork(*s);
        ASSERT_TRUE(f.ok());
        live.push_back(*f);
      } else if (op == 3) {
        Sequence* s = live[rnd(live.size())];
        ASSERT_TRUE(cache->truncate(*s, static_cast<int64_t>(rnd(static_cast<size_t>(s->n_tokens()) + 1))).ok());
      } else if (op == 4) {
        ASSERT_TRUE(cache->commit(*live[rnd(live.size())]).ok());
      } else if (op == 5) {
        const size_t i = rnd(live.size());
        cache->release(live[i]);
        live.erase(live.begin() + static_cast<ptrdiff_t>(i));
      } else {
        Sequence* s = live[rnd(live.size())];
        if (s->n_tokens() > 0) prompts[rnd(prompts.size())] = {s->tokens().begin(), s->tokens().end()};
      }
      // Reference counts.
      std::map<BlockId, uint32_t> expected;
      for (const Sequence* s : live) {
        for (BlockId b : s->block_table()) ++expected[b];
        ASSERT_EQ(s->block_table().size(), blocks_for_tokens(s->n_tokens(), 4));
      }
      for (auto node : cache->index().lru().nodes()) ++expected[cache->index().block_of(node)];
      const BlockPool& pool = cache->pool();
      uint32_t in_use = 0;
      for (BlockId b = 0; b < pool.capacity_blocks(); ++b) {
        const uint32_t want = expected.count(b) ? expected[b] : 0;
        ASSERT_EQ(pool.refcount(b), want) << "seed " << seed << " step " << step << " block " << b;
        in_use += want > 0;
      }
      ASSERT_EQ(pool.blocks_in_use(), in_use);
      // A partial last block is never shared with the index (only full blocks are indexed), and each
      // sequence reads exactly its own prefix's content.
      for (const Sequence* s : live) {
        expect_content(*s);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
    const KvCacheStats st = cache->stats();
    copies += st.pool.copies;
    evicted += st.index.evicted;
    reused += st.reused_tokens_memory;
    for (Sequence* s : live) cache->release(s);
    EXPECT_EQ(cache->pool().blocks_in_use(), cache->index().size());
  }
  // The workload must have exercised every path it is meant to check.
  EXPECT_GT(copies, 0u);
  EXPECT_GT(evicted, 0u);
  EXPECT_GT(reused, 0u);
  EXPECT_GT(refused, 0u);
}

}  // namespace
}  // namespace cedar::kv
