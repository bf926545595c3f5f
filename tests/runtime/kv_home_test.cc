// One KV home: running sequences and cached prefixes share one block pool. A prefix hit attaches the
// cached blocks (a reference each, no bytes copied), and a prefix shared by several live sequences is
// stored once.
#include <gtest/gtest.h>

#include <set>

#include "runtime/prefix_store.h"
#include "../model/tiny_model_util.h"

namespace cedar::runtime {
namespace {

constexpr uint32_t kBlockTokens = 32;

std::unique_ptr<PrefixStore> memory_store(const model::Model& m) {
  PrefixStoreOptions o;
  o.block_tokens = kBlockTokens;
  o.memory_blocks = 64;
  o.live_blocks = 256;
  auto store = PrefixStore::create(m, o);
  EXPECT_TRUE(store.ok()) << store.status().to_string();
  return std::move(*store);
}

// Runs `ids` through a fresh sequence of the store's home and saves it.
void compute_and_save(model::Model& m, PrefixStore& store, const std::vector<int32_t>& ids) {
  auto s = m.new_sequence(static_cast<int64_t>(ids.size()) + 1, store.cache());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const model::SeqChunk chunk{&*s, ids};
  std::vector<float> logits(m.config().vocab_size);
  ASSERT_TRUE(m.forward({&chunk, 1}, logits.data(), nullptr).ok());
  ASSERT_TRUE(store.save(*s, static_cast<int64_t>(ids.size())).ok());
}

TEST(KvHome, APrefixSharedByEightSequencesIsStoredOnce) {
  auto m = model::testing::load_tiny(2);
  auto store = memory_store(*m);
  const std::vector<int32_t> shared = model::testing::test_prompt(6 * kBlockTokens, 5);
  compute_and_save(*m, *store, shared);
  const kv::BlockPool& pool = store->cache().pool();
  const uint32_t used_after_first = pool.blocks_in_use();
  const uint64_t copies_before = pool.stats().copies;

  // Eight requests whose prompts start with the cached prefix and go on differently.
  std::vector<model::SequenceState> seqs;
  for (uint32_t i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt = shared;
    const std::vector<int32_t> own = model::testing::test_prompt(10, 100 + i);
    prompt.insert(prompt.end(), own.begin(), own.end());
    auto s = m->new_sequence(static_cast<int64_t>(prompt.size()) + 4, store->cache());
    ASSERT_TRUE(s.ok());
    auto plan = store->restore(prompt, ReplayMode::kBounded, *s);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    // Every whole block of the shared prefix was attached (the last token always runs).
    EXPECT_EQ(plan->cached_tokens, static_cast<int64_t>(shared.size())) << i;
    seqs.push_back(std::move(*s));
  }
  const size_t n_blocks = shared.size() / kBlockTokens;
  for (size_t k = 0; k < n_blocks; ++k) {
    std::set<kv::BlockId> ids;
    for (const model::SequenceState& s : seqs) ids.insert(s.kv().block_table()[k]);
    ASSERT_EQ(ids.size(), 1u) << "block " << k << " is held in " << ids.size() << " copies";
    // Eight sequences and the prefix index hold the one block.
    EXPECT_EQ(pool.refcount(*ids.begin()), 9u) << k;
  }
  // No block was copied and none was added for the shared prefix.
  EXPECT_EQ(pool.stats().copies, copies_before);
  EXPECT_EQ(pool.blocks_in_use(), used_after_first);
}

TEST(KvHome, APrefixHitCopiesNoKvBytesAndDecodesFromTheSharedBlocks) {
  auto m = model::testing::load_tiny(2);
  auto store = memory_store(*m);
  const std::vector<int32_t> shared = model::testing::test_prompt(4 * kBlockTokens, 7);
  compute_and_save(*m, *store, shared);
  const kv::BlockPool& pool = store->cache().pool();
  // The bytes of the cached blocks, to check that nothing writes them.
  std::vector<uint8_t> cached_bytes;
  auto probe = m->new_sequence(static_cast<int64_t>(shared.size()) + 8, store->cache());
  ASSERT_TRUE(probe.ok());
  std::vector<int32_t> prompt = shared;
  prompt.push_back(3);
  auto plan = store->restore(prompt, ReplayMode::kBounded, *probe);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->cached_tokens, static_cast<int64_t>(shared.size()));
  const uint64_t copies = pool.stats().copies, allocations = pool.stats().allocations;
  for (kv::BlockId b : probe->kv().block_table())
    cached_bytes.insert(cached_bytes.end(), pool.block_data(b), pool.block_data(b) + pool.geometry().block_bytes);
  EXPECT_EQ(allocations, pool.stats().allocations) << "a memory hit allocates no block";

  // The replay and a few decode steps: new positions go to a block of the sequence's own.
  std::vector<float> logits(m->config().vocab_size);
  const model::SeqChunk replay{&*probe, std::span<const int32_t>(prompt).subspan(static_cast<size_t>(plan->replay_from))};
  ASSERT_TRUE(m->forward({&replay, 1}, logits.data(), nullptr).ok());
  for (int32_t t : {5, 9, 11}) {
    const model::SeqChunk step{&*probe, std::span<const int32_t>(&t, 1)};
    ASSERT_TRUE(m->forward({&step, 1}, logits.data(), nullptr).ok());
  }
  EXPECT_EQ(pool.stats().copies, copies);
  std::vector<uint8_t> after;
  for (size_t k = 0; k < shared.size() / kBlockTokens; ++k) {
    const kv::BlockId b = probe->kv().block_table()[k];
    after.insert(after.end(), pool.block_data(b), pool.block_data(b) + pool.geometry().block_bytes);
  }
  cached_bytes.resize(after.size());
  EXPECT_EQ(after, cached_bytes) << "a shared block was written";
}

}  // namespace
}  // namespace cedar::runtime
