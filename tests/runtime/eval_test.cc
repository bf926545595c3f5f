// cedar eval's library: the windows, the all-rows head, the scores against logits recomputed
// independently from generate(), the KV-economy paths, and the n-gram baselines on a hand-computed case.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <set>

#include "core/thread_pool.h"
#include "ops/formats/formats.h"
#include "runtime/eval.h"
#include "runtime/prefix_store.h"
#include "runtime/ngram_baseline.h"
#include "../model/tiny_model_util.h"

namespace cedar::runtime {
namespace {

// -log softmax(logits)[target] over the first n logits, written out independently of ops/logprob.
double naive_nll(const std::vector<float>& logits, size_t n, int32_t target) {
  double m = -INFINITY;
  for (size_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(logits[i]));
  long double s = 0;
  for (size_t i = 0; i < n; ++i) s += std::exp(static_cast<long double>(logits[i]) - m);
  return -(static_cast<double>(logits[target]) - m - static_cast<double>(std::log(s)));
}

int32_t naive_argmax(const std::vector<float>& logits, size_t n) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(n)) -
                              logits.begin());
}

// The logits the first generated token is sampled from after `prompt`, fed in chunks of
// `prefill_chunk` tokens (0: one call), as the engine's chunked prefill feeds it.
std::vector<float> generate_logits(model::Model& m, std::span<const int32_t> prompt, size_t prefill_chunk = 0) {
  ThreadPool pool(2);
  model::SequenceState seq = m.new_sequence(static_cast<int64_t>(prompt.size()) + 2);
  std::vector<float> logits(m.config().vocab_size);
  const size_t step = prefill_chunk > 0 ? prefill_chunk : prompt.size();
  for (size_t pos = 0; pos < prompt.size(); pos += step) {
    model::SeqChunk c{&seq, prompt.subspan(pos, std::min(step, prompt.size() - pos))};
    Status st = m.forward({&c, 1}, logits.data(), &pool);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  return logits;
}

TEST(EvalWindows, EveryTargetOnceWithinCtx) {
  for (bool bos : {true, false})
    for (int ctx : {2, 3, 8, 16})
      for (int stride : {0, 1, 3, ctx - 1})
        for (size_t n : {2, 3, 7, 8, 9, 40}) {
          if (stride > ctx - 1) continue;
          auto ws = make_windows(n, bos, ctx, stride);
          ASSERT_TRUE(ws.ok()) << ws.status().to_string();
          std::vector<int> seen(n, 0);
          size_t next = 1;
          for (const EvalWindow& w : *ws) {
            EXPECT_LE(w.size(), static_cast<size_t>(ctx));
            EXPECT_EQ(w.score_from, next);  // targets in order, none skipped
            // Context before the first target: BOS, or a document token.
            EXPECT_TRUE(w.bos_prefix || w.begin < w.score_from);
            EXPECT_EQ(w.bos_prefix, bos && w.begin > 0);
            const size_t eff = stride ? static_cast<size_t>(stride) : static_cast<size_t>(ctx - 1);
            if (&w != &ws->front()) {
              EXPECT_LE(w.end - w.score_from, eff);
            }
            for (size_t j = w.score_from; j < w.end; ++j) {
              ++seen[j];
              EXPECT_LT(w.row_of_target(j), w.size() - 1);
            }
            next = w.end;
          }
          EXPECT_EQ(next, n);
          for (size_t j = 1; j < n; ++j) EXPECT_EQ(seen[j], 1) << "target " << j;
        }
  EXPECT_FALSE(make_windows(10, true, 1, 0).ok());
  EXPECT_FALSE(make_windows(10, true, 8, 8).ok());
  EXPECT_FALSE(make_windows(1, true, 8, 0).ok());
}

TEST(EvalWindows, NonOverlappingByDefault) {
  auto ws = make_windows(1 + 3 * 7, true, 8, 0);  // BOS + 21 text tokens, 7 per window
  ASSERT_TRUE(ws.ok());
  ASSERT_EQ(ws->size(), 3u);
  EXPECT_EQ((*ws)[1].begin, 8u);
  EXPECT_EQ((*ws)[1].score_from, 8u);
  EXPECT_TRUE((*ws)[1].bos_prefix);
  EXPECT_EQ((*ws)[2].end, 22u);
}

// Every row of forward_all_rows is bit-identical to forward()'s last-token logits of the same prefix:
// on the prefill path and on a continuation (decode path) chunk.
TEST(EvalRows, AllRowsEqualLastTokenLogits) {
  auto m = model::testing::load_tiny(3);
  ThreadPool pool(2);
  const auto prompt = model::testing::test_prompt(40, 5);
  const size_t V = m->config().vocab_size;
  for (size_t split : {size_t{0}, size_t{17}}) {
    model::SequenceState seq = m->new_sequence(64);
    std::vector<float> last(V);
    if (split) {
      model::SeqChunk c{&seq, std::span<const int32_t>(prompt).first(split)};
      ASSERT_TRUE(m->forward({&c, 1}, last.data(), &pool).ok());
    }
    std::vector<std::vector<float>> rows(prompt.size());
    size_t calls = 0;
    model::SeqChunk c{&seq, std::span<const int32_t>(prompt).subspan(split)};
    ASSERT_TRUE(m->forward_all_rows(c, [&](size_t first, size_t n, const float* l) {
                   ++calls;
                   for (size_t r = 0; r < n; ++r) rows[split + first + r].assign(l + r * V, l + (r + 1) * V);
                 }, &pool).ok());
    EXPECT_GE(calls, 2u);  // more rows than one head block
    for (size_t r = split; r < prompt.size(); r += 5) {
      // The same tokens fed the way generate feeds a prompt of r + 1 tokens.
      const auto want = generate_logits(*m, std::span<const int32_t>(prompt).first(r + 1), split ? split : 0);
      ASSERT_EQ(rows[r].size(), V) << r;
      EXPECT_EQ(0, std::memcmp(rows[r].data(), want.data(), V * sizeof(float))) << "split " << split << " row " << r;
    }
  }
}

// score_document's log-probabilities and top-1 equal -log softmax[target] recomputed here from the
// logits generate() produces for each window prefix (BOS + context), in exact numerics.
TEST(EvalScores, MatchGenerateLogitsPerWindow) {
  auto m = model::testing::load_tiny(3);
  ThreadPool pool(2);
  auto doc = model::testing::test_prompt(23, 9);
  doc[0] = 0;  // BOS
  EvalOptions o;
  o.ctx = 9;
  o.stride = 5;
  EvalWork work;
  auto s = score_document(*m, doc, /*has_bos=*/true, o, &pool, &work);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(s->position.size(), doc.size() - 1);
  auto windows = make_windows(doc.size(), true, o.ctx, o.stride);
  ASSERT_TRUE(windows.ok());
  EXPECT_EQ(work.windows, windows->size());
  const size_t vocab = m->sampleable_vocab();
  size_t k = 0;
  ScoreSummary summary;
  summary.add(*s, doc);
  double nll = 0;
  for (const EvalWindow& w : *windows)
    for (size_t j = w.score_from; j < w.end; ++j, ++k) {
      std::vector<int32_t> ctx;
      if (w.bos_prefix) ctx.push_back(doc[0]);
      ctx.insert(ctx.end(), doc.begin() + static_cast<std::ptrdiff_t>(w.begin), doc.begin() + static_cast<std::ptrdiff_t>(j));
      ASSERT_LE(ctx.size() + 1, static_cast<size_t>(o.ctx));
      const auto logits = generate_logits(*m, ctx);
      ASSERT_EQ(s->position[k], static_cast<int32_t>(j));
      EXPECT_NEAR(-s->logprob[k], naive_nll(logits, vocab, doc[j]), 1e-9) << j;
      EXPECT_EQ(s->argmax[k], naive_argmax(logits, vocab)) << j;
      nll += naive_nll(logits, vocab, doc[j]);
    }
  EXPECT_EQ(summary.tokens, doc.size() - 1);
  EXPECT_NEAR(summary.cross_entropy(), nll / static_cast<double>(doc.size() - 1), 1e-9);
  EXPECT_DOUBLE_EQ(summary.perplexity(), std::exp(summary.cross_entropy()));
}

// The prompt + continuation path: the continuation's scores are what generate computes with the
// prompt prefilled in one call and the rest fed after it (prefill_chunk = the split point).
TEST(EvalScores, SplitPathMatchesChunkedGenerate) {
  auto m = model::testing::load_tiny(3);
  ThreadPool pool(2);
  auto doc = model::testing::test_prompt(30, 4);
  doc[0] = 0;
  EvalOptions o;
  o.ctx = 30;
  o.path = EvalPath::kSplit;
  o.resume_at = 12;
  EvalWork work;
  auto s = score_document(*m, doc, true, o, &pool, &work);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(s->position.size(), doc.size() - 12);  // targets 12 .. 29
  EXPECT_EQ(work.prefix_tokens, 12u);
  for (size_t k = 0; k < s->position.size(); k += 4) {
    const size_t j = static_cast<size_t>(s->position[k]);
    const auto logits = generate_logits(*m, std::span<const int32_t>(doc).first(j), 12);
    EXPECT_NEAR(-s->logprob[k], naive_nll(logits, m->sampleable_vocab(), doc[j]), 1e-9) << j;
  }
}

// Bounded replay resumes from the prefix cache: it replays one window of the prompt (not all of it) and
// scores the same targets as the split reference.
TEST(EvalScores, BoundedReplayScoresTheSameTargets) {
  auto m = model::testing::load_tiny(3);
  ThreadPool pool(2);
  auto doc = model::testing::test_prompt(80, 8);
  doc[0] = 0;
  EvalOptions o;
  o.ctx = 80;
  o.resume_at = 48;
  o.path = EvalPath::kSplit;
  auto ref = score_document(*m, doc, true, o, &pool, nullptr);
  o.path = EvalPath::kBounded;
  EvalWork work;
  auto var = score_document(*m, doc, true, o, &pool, &work);
  ASSERT_TRUE(ref.ok() && var.ok());
  ScoreComparison cmp;
  ASSERT_TRUE(cmp.add(*ref, *var).ok());
  EXPECT_EQ(cmp.tokens, 80u - 48u);
  EXPECT_GT(cmp.agreement(), 0.0);
  EXPECT_EQ(work.prefix_tokens, 48u);
  EXPECT_GE(work.replayed_tokens, static_cast<uint64_t>(m->config().window_size));
  EXPECT_LT(work.replayed_tokens, 48u);
  for (double lp : var->logprob) EXPECT_TRUE(std::isfinite(lp));
  // Identical runs compare as identical.
  ScoreComparison self;
  ASSERT_TRUE(self.add(*ref, *ref).ok());
  EXPECT_EQ(self.delta_cross_entropy(), 0.0);
  EXPECT_EQ(self.agreement(), 1.0);
  TokenScores shorter = *ref;
  shorter.position.pop_back();
  EXPECT_FALSE(self.add(*ref, shorter).ok());
}

// The bf16 KV experiment: entries hold exactly the bf16 rounding, sequences carry their format, and
// the reference format (the default) is untouched.
TEST(EvalKv, Bf16KvIsAnExperimentOnly) {
  std::vector<float> x = {1.0f, -3.14159f, 1e-20f, 65504.7f, 0.1f};
  std::vector<uint8_t> b(2 * x.size());
  ops::f32_to_bf16_bytes(x.data(), b.data(), x.size());
  std::vector<float> y(x.size());
  ops::bf16_bytes_to_f32(b.data(), y.data(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], ops::round_bf16(x[i]));

  auto m = model::testing::load_tiny(3);
  ThreadPool pool(2);
  const auto prompt = model::testing::test_prompt(24, 2);
  const size_t V = m->config().vocab_size;
  std::vector<float> ref(V), bf(V);
  model::SequenceState s_ref = m->new_sequence(32);
  model::SeqChunk c{&s_ref, prompt};
  ASSERT_TRUE(m->forward({&c, 1}, ref.data(), &pool).ok());
  m->set_kv_dtype(model::KvDtype::kBf16);
  model::SequenceState s_bf = m->new_sequence(32);
  EXPECT_GT(model::held_bytes(s_bf), model::held_bytes(s_ref));
  model::SeqChunk mixed{&s_ref, std::span<const int32_t>(prompt).first(1)};
  EXPECT_FALSE(m->forward({&mixed, 1}, bf.data(), &pool).ok());  // a reference-format sequence
  model::SeqChunk cb{&s_bf, prompt};
  ASSERT_TRUE(m->forward({&cb, 1}, bf.data(), &pool).ok());
  EXPECT_NE(0, std::memcmp(ref.data(), bf.data(), V * sizeof(float)));
  for (float v : bf) ASSERT_TRUE(std::isfinite(v));
  m->set_kv_dtype(model::KvDtype::kReference);
  model::SequenceState s_again = m->new_sequence(32);
  model::SeqChunk ca{&s_again, prompt};
  std::vector<float> again(V);
  ASSERT_TRUE(m->forward({&ca, 1}, again.data(), &pool).ok());
  EXPECT_EQ(0, std::memcmp(ref.data(), again.data(), V * sizeof(float)));
  // The prefix cache refuses the experimental format.
  m->set_kv_dtype(model::KvDtype::kBf16);
  EXPECT_FALSE(PrefixStore::create(*m, PrefixStoreOptions{}).ok());
  m->set_kv_dtype(model::KvDtype::kReference);
}

// With decoder narrowing the early rows of a long prefill never reach the head: forward_all_rows
// reports only the tail, with its true row numbers.
TEST(EvalRows, NarrowingReportsTheTailOnly) {
  auto m = model::testing::load_tiny(3);
  ThreadPool pool(2);
  m->set_decoder_narrowing(true);
  const auto prompt = model::testing::test_prompt(40, 6);
  model::SequenceState seq = m->new_sequence(64);
  std::set<size_t> rows;
  ASSERT_TRUE(m->forward_all_rows({&seq, prompt}, [&](size_t first, size_t n, const float*) {
                 for (size_t r = 0; r < n; ++r) rows.insert(first + r);
               }, &pool).ok());
  m->set_decoder_narrowing(false);
  const size_t win = static_cast<size_t>(m->config().window_size);
  ASSERT_EQ(rows.size(), win);
  EXPECT_EQ(*rows.begin(), prompt.size() - win);
  EXPECT_EQ(*rows.rbegin(), prompt.size() - 1);
}

// The baselines on a corpus small enough to compute by hand. V = 5 ids; training docs (0 = BOS):
//   [0 1 2 1]  [0 1 1]    targets: 1 2 1 1 1  -> c(1) = 4, c(2) = 1, N = 5
//   bigrams: (0,1) x2, (1,2), (2,1), (1,1)    -> B = 4 distinct; c(u=1) = 2, n(1) = 2; c(0) = 2, n(0) = 1
//   predecessors m(w): m(1) = 3 (0, 2, 1), m(2) = 1
TEST(NgramBaseline, HandComputedCase) {
  NgramBaseline b({{0, 1, 2, 1}, {0, 1, 1}}, 5);
  EXPECT_EQ(b.targets(), 5u);
  EXPECT_EQ(b.distinct_bigrams(), 4u);
  // Unigram add-one: (c + 1) / (5 + 5).
  EXPECT_NEAR(b.unigram_logprob(1), std::log(5.0 / 10), 1e-12);
  EXPECT_NEAR(b.unigram_logprob(2), std::log(2.0 / 10), 1e-12);
  EXPECT_NEAR(b.unigram_logprob(4), std::log(1.0 / 10), 1e-12);
  EXPECT_EQ(b.unigram_argmax(), 1);
  // q(w) = (m(w) + 1) / (4 + 5): q(1) = 4/9, q(2) = 2/9, q(0) = q(3) = q(4) = 1/9.
  // u = 1: c(1,2) = 1, c(1,1) = 1, c(1) = 2, n(1) = 2, lambda = 0.75 * 2 / 2 = 0.75.
  EXPECT_NEAR(b.bigram_logprob(1, 2), std::log(0.25 / 2 + 0.75 * 2.0 / 9), 1e-12);
  EXPECT_NEAR(b.bigram_logprob(1, 1), std::log(0.25 / 2 + 0.75 * 4.0 / 9), 1e-12);
  EXPECT_NEAR(b.bigram_logprob(1, 3), std::log(0.75 * 1.0 / 9), 1e-12);
  // u = 0: c(0,1) = 2, c(0) = 2, n(0) = 1, lambda = 0.375.
  EXPECT_NEAR(b.bigram_logprob(0, 1), std::log(1.25 / 2 + 0.375 * 4.0 / 9), 1e-12);
  EXPECT_NEAR(b.bigram_logprob(0, 2), std::log(0.375 * 2.0 / 9), 1e-12);
  // An unseen context: q alone.
  EXPECT_NEAR(b.bigram_logprob(3, 2), std::log(2.0 / 9), 1e-12);
  EXPECT_EQ(b.bigram_argmax(1), 1);  // 0.125 + 0.333 beats 0.125 + 0.167
  EXPECT_EQ(b.bigram_argmax(0), 1);
  EXPECT_EQ(b.bigram_argmax(3), 1);
  EXPECT_EQ(b.bigram_argmax(2), 1);  // c(2,1) = 1: the only successor
  // Each conditional distribution sums to one.
  for (int32_t u : {0, 1, 2, 3}) {
    double sum = 0;
    for (int32_t w = 0; w < 5; ++w) sum += std::exp(b.bigram_logprob(u, w));
    EXPECT_NEAR(sum, 1.0, 1e-12) << u;
  }
}

// The unseen-successor branch of the bigram argmax: a context whose only successor is rare loses to
// the best continuation when the discount mass is large enough.
TEST(NgramBaseline, ArgmaxConsidersUnseenSuccessors) {
  // u = 3 is followed once by 4; 1 has the most predecessors. p(4|3) = 0.25 + 0.75 q(4),
  // p(1|3) = 0.75 q(1). Here q(1) = (3 + 1) / (B + V) with many predecessors of 1.
  NgramBaseline b({{0, 1}, {2, 1}, {4, 1}, {5, 1}, {6, 1}, {3, 4}}, 8);
  // B = 6 bigrams, V = 8: q(1) = 6/14, q(4) = 2/14. p(4|3) = 0.25 + 0.75 * 2/14 = 0.357;
  // p(1|3) = 0.75 * 6/14 = 0.321 -> 4 still wins.
  EXPECT_EQ(b.bigram_argmax(3), 4);
  NgramBaseline c({{0, 1}, {2, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1}, {8, 1}, {9, 1}, {3, 4}}, 10);
  // B = 9, V = 10: q(1) = 9/19, q(4) = 2/19. p(4|3) = 0.25 + 0.75 * 2/19 = 0.329; p(1|3) = 0.355 -> 1.
  EXPECT_EQ(c.bigram_argmax(3), 1);
}

}  // namespace
}  // namespace cedar::runtime
