// SequenceJournal (src/model/sequence_journal.h): a verify pass over the true tokens followed by
// rejected ones, rolled back to the true prefix, leaves every byte of the sequence state as a run that
// fed only the true tokens one at a time (windows, compressor rows, compressed entries, index-key slot,
// Engram history, tokens), and the logits that follow are the same bits.
#include <gtest/gtest.h>

#include <cstring>

#include "core/thread_pool.h"
#include "model/sequence_journal.h"
#include "tiny_model_util.h"

namespace cedar::model {
namespace {

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

bool same_bytes(const uint8_t* a, const uint8_t* b, size_t n) { return std::memcmp(a, b, n) == 0; }

// Every meaningful byte of the state (floats by their bytes: -inf rows and NaN payloads included):
// the KV home's tokens, blocks and every written entry, the window rings, the compressor rows, and
// the scalars. (Entries past an owner's written count are rewritten before anything reads them.)
void expect_same_state(SequenceState& a, SequenceState& b, int n_layers, const std::string& where) {
  EXPECT_EQ(a.n_tokens, b.n_tokens) << where;
  EXPECT_EQ(a.capacity, b.capacity) << where;
  EXPECT_TRUE(std::equal(a.kv().tokens().begin(), a.kv().tokens().end(), b.kv().tokens().begin(),
                         b.kv().tokens().end()))
      << where;
  EXPECT_EQ(a.kv().block_table().size(), b.kv().block_table().size()) << where;
  const kv::CacheGeometry& g = a.geometry();
  for (int l = 0; l < n_layers; ++l)
    EXPECT_TRUE(same_bytes(a.window_ring(l), b.window_ring(l), size_t{g.window_slots} * g.window_entry_bytes))
        << where << " window " << l;
  EXPECT_EQ(a.owner_entries, b.owner_entries) << where;
  for (size_t o = 0; o < g.owners.size() && a.owner_entries == b.owner_entries; ++o) {
    const kv::OwnerGeometry& og = g.owners[o];
    const int oi = static_cast<int>(o);
    for (int64_t j = 0; j < a.owner_entries[o]; ++j) {
      EXPECT_TRUE(same_bytes(a.kv().main_entry(oi, j), b.kv().main_entry(oi, j), og.main_entry_bytes))
          << where << " main entry " << j << " of owner " << og.layer;
      if (og.index_entry_bytes)
        EXPECT_TRUE(same_bytes(a.kv().index_key(oi, j), b.kv().index_key(oi, j), og.index_entry_bytes))
            << where << " index key " << j << " of owner " << og.layer;
    }
    EXPECT_TRUE(same_bytes(a.kv().compressor_tail(oi).data(), b.kv().compressor_tail(oi).data(), og.live_tail_bytes))
        << where << " compressor rows of owner " << og.layer;
  }
  EXPECT_EQ(a.index_key_slot, b.index_key_slot) << where;
  EXPECT_EQ(a.engram.compressed, b.engram.compressed) << where;
  EXPECT_EQ(a.window_floor, b.window_floor) << where;
  EXPECT_EQ(a.replay_until, b.replay_until) << where;
  EXPECT_EQ(a.journal, nullptr) << where;
  EXPECT_EQ(b.journal, nullptr) << where;
}

// Feeds `truth` after the prompt two ways: one token per call (plain decode), and verify passes of
// `pass` positions whose first `keep` tokens are the true ones and the rest other ids, each rolled
// back to `keep`. The keeps cycle through every value 0..pass; the states are compared after every
// pass, and the logits of the next true token after each.
void drafted_equals_plain(uint64_t seed, bool wide_kv, int pass) {
  auto m = testing::load_tiny(seed, IndexKeyMode::kReference, wide_kv);
  ThreadPool pool(2);
  const size_t vocab = m->config().vocab_size;
  const auto prompt = testing::test_prompt(21, 5);
  const auto truth = testing::test_prompt(70, 6);
  const auto junk = testing::test_prompt(70, 7);
  const int64_t capacity = 21 + 70 + 8;
  SequenceState plain = m->new_sequence(capacity), drafted = m->new_sequence(capacity);
  SequenceJournal journal(m->config(), m->plan(), pass);
  std::vector<float> a(vocab), b(vocab);
  for (SequenceState* s : {&plain, &drafted}) {
    SeqChunk c{s, prompt};
    ASSERT_TRUE(m->forward({&c, 1}, a.data(), &pool).ok());
  }
  size_t fed = 0;
  for (int round = 0; fed + pass < truth.size(); ++round) {
    const int keep = round % (pass + 1);
    std::vector<int32_t> chunk(truth.begin() + fed, truth.begin() + fed + keep);
    for (int t = keep; t < pass; ++t) chunk.push_back(junk[fed + t] != truth[fed + t] ? junk[fed + t] : junk[fed + t] + 1);
    ASSERT_TRUE(journal.begin(drafted, pass).ok());
    SeqChunk c{&drafted, chunk};
    ASSERT_TRUE(m->forward({&c, 1}, b.data(), &pool).ok());
    ASSERT_TRUE(journal.rollback(drafted, keep).ok());
    for (int t = 0; t < keep; ++t) {
      SeqChunk one{&plain, {&truth[fed + t], 1}};
      ASSERT_TRUE(m->forward({&one, 1}, a.data(), &pool).ok());
    }
    fed += keep;
    const std::string where = "round " + std::to_string(round) + " keep " + std::to_string(keep) + " at " +
                              std::to_string(plain.n_tokens);
    expect_same_state(plain, drafted, m->config().n_layers, where);
    // The next true token on both: the same logits, and the same state again.
    for (SequenceState* s : {&plain, &drafted}) {
      SeqChunk one{s, {&truth[fed], 1}};
      ASSERT_TRUE(m->forward({&one, 1}, (s == &plain ? a : b).data(), &pool).ok());
    }
    ++fed;
    EXPECT_TRUE(same_bytes(a, b)) << where;
    expect_same_state(plain, drafted, m->config().n_layers, where + " +1");
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SequenceJournal, RolledBackPassesEqualPlainDecode) { drafted_equals_plain(1, false, 6); }
TEST(SequenceJournal, RolledBackPassesEqualPlainDecodeWideWindow) { drafted_equals_plain(2, true, 6); }
// Passes of 3 positions: keeps land on either side of every ratio-2 group boundary.
TEST(SequenceJournal, RolledBackShortPassesEqualPlainDecode) { drafted_equals_plain(3, false, 3); }

TEST(SequenceJournal, RefusesPassesItCannotUndo) {
  auto m = testing::load_tiny(1);
  ThreadPool pool(2);
  SequenceJournal journal(m->config(), m->plan(), 6);
  SequenceState seq = m->new_sequence(30);
  EXPECT_EQ(journal.begin(seq, 3).code(), StatusCode::kInvalidArgument);  // before the prefill
  const auto prompt = testing::test_prompt(25, 1);
  std::vector<float> logits(m->config().vocab_size);
  SeqChunk c{&seq, prompt};
  ASSERT_TRUE(m->forward({&c, 1}, logits.data(), &pool).ok());
  EXPECT_EQ(journal.begin(seq, 7).code(), StatusCode::kInvalidArgument);  // longer than it was made for
  EXPECT_EQ(journal.begin(seq, 6).code(), StatusCode::kInvalidArgument);  // past the capacity of 30
  ASSERT_TRUE(journal.begin(seq, 5).ok());
  EXPECT_EQ(journal.begin(seq, 5).code(), StatusCode::kFailedPrecondition);  // one pass at a time
  // The pass did not run: nothing to roll back to.
  EXPECT_EQ(journal.rollback(seq, 1).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cedar::model
