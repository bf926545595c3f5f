// A forked sequence state shares its parent's blocks of global KV and continues exactly as a
// sequence that computed the same positions itself (window ring, compressor tail, Engram history and
// the index-key slot copied; the shared partial block copied on the first divergent write).
#include <gtest/gtest.h>

#include <cstring>

#include "core/thread_pool.h"
#include "tiny_model_util.h"

namespace cedar::model {
namespace {

std::vector<float> feed(Model& m, SequenceState& s, std::span<const int32_t> ids, ThreadPool* pool) {
  std::vector<float> logits(m.config().vocab_size);
  const SeqChunk c{&s, ids};
  const Status st = m.forward({&c, 1}, logits.data(), pool);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return logits;
}

TEST(SequenceFork, ForkedBranchesDecodeAsIfEachHadComputedThePrefix) {
  auto m = testing::load_tiny(1);
  ThreadPool pool(2);
  // 75 tokens: past the window and several blocks of 64 tokens, ending inside a ratio-2 group and a block.
  const std::vector<int32_t> prefix = testing::test_prompt(75, 4);
  const std::vector<int32_t> x = testing::test_prompt(20, 5), y = testing::test_prompt(20, 6);
  SequenceState parent = m->new_sequence(128);
  feed(*m, parent, prefix, &pool);
  auto child = parent.fork();
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  // Both share every block of the prefix until one of them writes.
  ASSERT_EQ(child->kv().block_table(), parent.kv().block_table());
  std::vector<float> px, cy;
  for (size_t i = 0; i < x.size(); ++i) {  // decode token by token, alternating branches
    px = feed(*m, parent, {&x[i], 1}, &pool);
    cy = feed(*m, *child, {&y[i], 1}, &pool);
  }
  EXPECT_NE(child->kv().block_table().back(), parent.kv().block_table().back()) << "the partial block was not copied";
  EXPECT_EQ(child->kv().block_table().front(), parent.kv().block_table().front()) << "a full block was copied";

  // The same positions computed from scratch, each on its own.
  SequenceState a = m->new_sequence(128), b = m->new_sequence(128);
  feed(*m, a, prefix, &pool);
  feed(*m, b, prefix, &pool);
  std::vector<float> ax, by;
  for (size_t i = 0; i < x.size(); ++i) {
    ax = feed(*m, a, {&x[i], 1}, &pool);
    by = feed(*m, b, {&y[i], 1}, &pool);
  }
  EXPECT_EQ(0, std::memcmp(px.data(), ax.data(), px.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(cy.data(), by.data(), cy.size() * sizeof(float)));
  EXPECT_NE(0, std::memcmp(px.data(), cy.data(), px.size() * sizeof(float)));
}

}  // namespace
}  // namespace cedar::model
