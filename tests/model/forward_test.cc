// Properties of the forward pass that follow from the reference's semantics (spec §4, §9.1) and
// cedar's chunk rules (model.h), checked on tiny random checkpoints. Agreement with the independent
// golden implementation is tested in golden_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "model/forward_batch.h"
#include "ops/linear/bf16_coded.h"
#include "tiny_model_util.h"

namespace cedar::model {
namespace {

using testing::load_tiny;
using testing::test_prompt;

std::vector<float> run_chunks(Model& m, SequenceState& seq, const std::vector<int32_t>& ids,
                              const std::vector<size_t>& cuts, ThreadPool* pool) {
  std::vector<float> logits(m.config().vocab_size);
  size_t pos = static_cast<size_t>(seq.n_tokens);  // cuts are absolute positions in `ids`
  for (size_t cut : cuts) {
    SeqChunk c{&seq, std::span<const int32_t>(ids).subspan(pos, cut - pos)};
    Status st = m.forward({&c, 1}, logits.data(), pool);
    EXPECT_TRUE(st.ok()) << st.to_string();
    pos = cut;
  }
  return logits;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

class ForwardModes : public ::testing::TestWithParam<IndexKeyMode> {};

// A chunk after position 0 follows the decode path token by token, so splitting it any way gives
// the same bits (90 tokens cross the window (16), the top-k (16), the candidate pool (32 entries)
// and many ratio-2 group boundaries).
TEST_P(ForwardModes, ChunkedContinuationEqualsTokenByToken) {
  auto m = load_tiny(1, GetParam());
  ThreadPool pool(2);
  const auto ids = test_prompt(90);
  SequenceState a = m->new_sequence(128), b = m->new_sequence(128), c = m->new_sequence(128);
  std::vector<size_t> one_by_one = {7};
  for (size_t i = 8; i <= 90; ++i) one_by_one.push_back(i);
  auto la = run_chunks(*m, a, ids, {7, 90}, &pool);
  auto lb = run_chunks(*m, b, ids, one_by_one, &pool);
  auto lc = run_chunks(*m, c, ids, {7, 9, 20, 21, 50, 90}, &pool);
  EXPECT_TRUE(bit_equal(la, lb)) << "max |diff| " << max_abs_diff(la, lb);
  EXPECT_TRUE(bit_equal(la, lc)) << "max |diff| " << max_abs_diff(la, lc);
  for (float v : la) ASSERT_TRUE(std::isfinite(v));
}

// Dequantised index keys persist across forward passes, keyed by the sequence state's address. A
// state reused for another prompt (same address, partly the same tokens) must get exactly the bits a
// fresh state gets: the cache keeps only rows whose packed bytes still match.
TEST_P(ForwardModes, ReusedSequenceStateGivesTheBitsOfAFreshOne) {
  auto m = load_tiny(1, GetParam());
  ThreadPool pool(2);
  const auto a = test_prompt(90);
  auto b = a;
  for (size_t i = 40; i < b.size(); ++i) b[i] = a[(i * 7) % a.size()];  // same first 40 tokens
  std::vector<size_t> cuts = {30};
  for (size_t i = 31; i <= 90; ++i) cuts.push_back(i);  // prefill, then decode steps
  SequenceState s = m->new_sequence(128);
  run_chunks(*m, s, a, cuts, &pool);
  s = m->new_sequence(128);  // the same object, so the same cache key
  const auto reused = run_chunks(*m, s, b, cuts, &pool);
  SequenceState fresh = m->new_sequence(128);
  auto other = load_tiny(1, GetParam());
  const auto want = run_chunks(*other, fresh, b, cuts, &pool);
  EXPECT_TRUE(bit_equal(reused, want)) << "max |diff| " << max_abs_diff(reused, want);
}

INSTANTIATE_TEST_SUITE_P(IndexKeys, ForwardModes,
                         ::testing::Values(IndexKeyMode::kReference, IndexKeyMode::kOwner),
                         [](const auto& info) { return info.param == IndexKeyMode::kReference ? "reference" : "owner"; });

// Sequences batched together at different positions give the bits they give alone.
TEST(Forward, BatchEqualsSeparate) {
  auto m = load_tiny(2);
  ThreadPool pool(2);
  const auto p1 = test_prompt(40, 1), p2 = test_prompt(23, 2), p3 = test_prompt(61, 3);
  // Alone.
  std::vector<std::vector<float>> alone;
  for (const auto* p : {&p1, &p2, &p3}) {
    SequenceState s = m->new_sequence(128);
    alone.push_back(run_chunks(*m, s, *p, {p->size() - 3, p->size()}, &pool));
  }
  // Together: three prefills in one call, then the three continuations in one call.
  SequenceState s1 = m->new_sequence(128), s2 = m->new_sequence(128), s3 = m->new_sequence(128);
  const size_t V = m->config().vocab_size;
  std::vector<float> logits(3 * V);
  std::vector<SeqChunk> pre = {{&s1, std::span(p1).first(p1.size() - 3)},
                               {&s2, std::span(p2).first(p2.size() - 3)},
                               {&s3, std::span(p3).first(p3.size() - 3)}};
  ASSERT_TRUE(m->forward(pre, logits.data(), &pool).ok());
  std::vector<SeqChunk> rest = {{&s1, std::span(p1).last(3)}, {&s2, std::span(p2).last(3)}, {&s3, std::span(p3).last(3)}};
  ASSERT_TRUE(m->forward(rest, logits.data(), &pool).ok());
  for (int i = 0; i < 3; ++i) {
    std::vector<float> got(logits.begin() + i * V, logits.begin() + (i + 1) * V);
    EXPECT_TRUE(bit_equal(got, alone[i])) << "sequence " << i << " max |diff| " << max_abs_diff(got, alone[i]);
  }
}

// Runs ids in the given chunks (a prefill, then decode steps) with 1, 2 and 3 threads and expects the
// same logits bit for bit, all finite.
void expect_thread_counts_agree(Model& m, const std::vector<int32_t>& ids, const std::vector<size_t>& cuts) {
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    SequenceState seq = m.new_sequence(static_cast<int64_t>(ids.size()));
    const auto logits = run_chunks(m, seq, ids, cuts, &pool);
    if (first.empty()) {
      first = logits;
      for (float v : first) ASSERT_TRUE(std::isfinite(v));
      continue;
    }
    EXPECT_TRUE(bit_equal(first, logits)) << threads << " threads, max |diff| " << max_abs_diff(first, logits);
  }
}

TEST(Forward, ThreadCountDoesNotChangeBits) {
  auto m = load_tiny(3);
  expect_thread_counts_agree(*m, test_prompt(50, 7), {30, 50});
}

// With a 128-entry window and top-128 selection a decode step has enough KV to dequantise on all
// threads (kMinParallelDequantFloats): the split never changes a bit. 200 tokens give the ratio-1
// layers more than 128 compressed entries, so the selected ones are dequantised in parallel too.
TEST(Forward, ParallelKvDequantisationDoesNotChangeBits) {
  auto m = load_tiny(5, IndexKeyMode::kReference, /*wide_kv=*/true);
  const ModelConfig& c = m->config();
  ASSERT_GE(c.window_size * c.head_dim, kMinParallelDequantFloats) << "the test must reach the parallel path";
  ASSERT_GE(c.index_topk * c.head_dim, kMinParallelDequantFloats);
  expect_thread_counts_agree(*m, test_prompt(200, 3), {150, 200});
}

// The index-key slot quirk (spec §9.1) only changes a ratio-2 layer's selection at an even decode
// position once it has more compressed entries than index_topk (16 in the tiny preset): before
// that every entry is selected whatever the scores. So the two modes agree on short sequences and
// disagree on long ones.
TEST(Forward, IndexKeyModesDifferOnlyWhenSelectionMatters) {
  auto ref = load_tiny(4, IndexKeyMode::kReference);
  auto own = load_tiny(4, IndexKeyMode::kOwner);
  ThreadPool pool(2);
  const auto ids = test_prompt(100, 9);
  SequenceState a = ref->new_sequence(128), b = own->new_sequence(128);
  // Prefill 10 tokens, then decode to position 24: entries per ratio-2 layer stay <= 12 < 16.
  std::vector<size_t> cuts = {10};
  for (size_t i = 11; i <= 25; ++i) cuts.push_back(i);
  auto la = run_chunks(*ref, a, ids, cuts, &pool);
  auto lb = run_chunks(*own, b, ids, cuts, &pool);
  EXPECT_TRUE(bit_equal(la, lb)) << "max |diff| " << max_abs_diff(la, lb);
  // Continue to position 99 one token at a time: 50 ratio-2 entries > 16, the quirk bites.
  bool differed = false;
  for (size_t i = 26; i <= 100; ++i) {
    la = run_chunks(*ref, a, ids, {i}, &pool);  // `cuts` continue from the state's position
    lb = run_chunks(*own, b, ids, {i}, &pool);
    differed |= !bit_equal(la, lb);
  }
  EXPECT_TRUE(differed);
}

// Decoder narrowing runs the layers after the last KV source on the last window_size prompt tokens
// only: identical for prompts no longer than the window, different (an approximation) beyond.
TEST(Forward, DecoderNarrowingIsExactWithinTheWindow) {
  auto m = load_tiny(5);
  ThreadPool pool(2);
  const auto short_ids = test_prompt(16, 11), long_ids = test_prompt(80, 12);
  SequenceState a = m->new_sequence(128), b = m->new_sequence(128);
  auto full_short = run_chunks(*m, a, short_ids, {16}, &pool);
  SequenceState c = m->new_sequence(128), d = m->new_sequence(128);
  auto full_long = run_chunks(*m, c, long_ids, {80}, &pool);
  m->set_decoder_narrowing(true);
  auto narrow_short = run_chunks(*m, b, short_ids, {16}, &pool);
  auto narrow_long = run_chunks(*m, d, long_ids, {80}, &pool);
  m->set_decoder_narrowing(false);
  EXPECT_TRUE(bit_equal(full_short, narrow_short)) << max_abs_diff(full_short, narrow_short);
  EXPECT_FALSE(bit_equal(full_long, narrow_long));
  // Decoding continues from the narrowed state.
  std::vector<int32_t> next = {123};
  SeqChunk ch{&d, next};
  std::vector<float> logits(m->config().vocab_size);
  ASSERT_TRUE(m->forward({&ch, 1}, logits.data(), &pool).ok());
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

// cedar-mini's head [129280, 192] re-coded: per row one block of 128 (192 bytes), a plain tail of 64
// (128 bytes) and a 16-byte table, plus 129,281 row offsets of 4 bytes; no exception block (every row's
// high bytes fit its table, counted from the checkpoint outside cedar).
constexpr int64_t kMiniCodedHeadBytes = int64_t{129280} * (192 + 128 + 16) + int64_t{129281} * 4;

// Fast numerics re-code the head for the GEMV (ModelWeights::head_coded), losslessly, on the trained
// cedar-mini (192 columns: one coded block and a plain tail per row); exact numerics leave it alone
// until a switch to fast.
TEST(Forward, FastNumericsReCodeTheHeadLosslessly) {
  const std::string dir = std::string(CEDAR_SOURCE_DIR) + "/models/cedar-mini";
  ModelOptions fast;
  fast.numerics = ops::Numerics::kFast;
  auto m = Model::load(dir, fast);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ops::Bf16Weight& head = (*m)->weights().head;
  ASSERT_NE(head.coded, nullptr);
  EXPECT_EQ(head.coded, (*m)->weights().head_coded.get());
  for (size_t r = 0; r < head.n; r += 61)
    for (size_t i = 0; i < head.k; ++i)
      ASSERT_EQ(ops::bf16_coded_bits(*head.coded, r, i), head.bits[r * head.k + i]) << "row " << r << " col " << i;
  EXPECT_EQ((*m)->residency_plan().coded_head_bytes, kMiniCodedHeadBytes);

  auto e = Model::load(dir);  // the library's default: exact
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->weights().head.coded, nullptr);
  EXPECT_EQ((*e)->residency_plan().coded_head_bytes, 0);
  (*e)->set_numerics(ops::Numerics::kFast);
  EXPECT_NE((*e)->weights().head.coded, nullptr);
}

// Under a memory budget the re-coded head exists only where the plan holds it: loaded fast, it is
// coded and counted; loaded exact and switched to fast, the GEMV reads the bf16 head (uncounted memory
// would break the budget).
TEST(Forward, UnderABudgetTheHeadIsCodedOnlyWhenPlanned) {
  const std::string dir = std::string(CEDAR_SOURCE_DIR) + "/models/cedar-mini";
  ModelOptions o;
  o.residency.memory_budget = uint64_t{4} << 30;
  o.numerics = ops::Numerics::kFast;
  auto fast = Model::load(dir, o);
  ASSERT_TRUE(fast.ok()) << fast.status().to_string();
  EXPECT_NE((*fast)->weights().head.coded, nullptr);
  EXPECT_EQ((*fast)->residency_plan().coded_head_bytes, kMiniCodedHeadBytes);
  o.numerics = ops::Numerics::kExact;
  auto exact = Model::load(dir, o);
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  (*exact)->set_numerics(ops::Numerics::kFast);
  EXPECT_EQ((*exact)->weights().head.coded, nullptr);
  EXPECT_EQ((*exact)->residency_plan().coded_head_bytes, 0);
}

// Exact numerics ignore the coded head: a model that ran fast (and coded its head) gives the exact
// run's logits bit for bit when switched back.
TEST(Forward, ExactLogitsSurviveAFastRun) {
  auto m = Model::load(std::string(CEDAR_SOURCE_DIR) + "/models/cedar-mini");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  Model& model = **m;
  ThreadPool pool(2);
  const size_t V = model.config().vocab_size;
  const std::vector<int32_t> prompt = {0, 400, 1200, 77, 5005, 31};
  const auto run = [&](std::vector<float>& logits) {
    SequenceState seq = model.new_sequence(16);
    SeqChunk c{&seq, prompt};
    ASSERT_TRUE(model.forward({&c, 1}, logits.data(), &pool).ok());
    const int32_t next = 9;
    SeqChunk d{&seq, {&next, 1}};  // one decode step: the head's GEMV
    ASSERT_TRUE(model.forward({&d, 1}, logits.data(), &pool).ok());
  };
  std::vector<float> before(V), fast(V), after(V);
  run(before);
  model.set_numerics(ops::Numerics::kFast);
  ASSERT_NE(model.weights().head.coded, nullptr);
  run(fast);
  model.set_numerics(ops::Numerics::kExact);
  run(after);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), V * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(before.data(), fast.data(), V * sizeof(float)), 0) << "the fast run did run fast";
}

TEST(Forward, RejectsBadInput) {
  auto m = load_tiny(1);
  SequenceState s = m->new_sequence(8);
  std::vector<float> logits(m->config().vocab_size);
  std::vector<int32_t> bad = {1, -5};
  SeqChunk c{&s, bad};
  EXPECT_EQ(m->forward({&c, 1}, logits.data(), nullptr).code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> too_long(9, 5);
  SeqChunk d{&s, too_long};
  EXPECT_EQ(m->forward({&d, 1}, logits.data(), nullptr).code(), StatusCode::kInvalidArgument);
  SeqChunk e{&s, {}};
  EXPECT_EQ(m->forward({&e, 1}, logits.data(), nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.n_tokens, 0);  // nothing was consumed
}

}  // namespace
}  // namespace cedar::model
