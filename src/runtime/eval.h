// Scoring text with the model (`cedar eval`, docs/EVAL.md): cross-entropy, perplexity and top-1
// accuracy of every token of a document after its first, in windows of at most `ctx` tokens, and the
// same scores under the KV economy's alternatives (bounded replay, decoder narrowing; the bf16 KV and
// the numerics are model settings the caller chooses) so that they can be compared token by token.
//
// Windows (documented in docs/EVAL.md): a document d[0, N) (d[0] is BOS when the tokenizer adds one)
// is cut into windows of at most ctx tokens. The first is d[0, min(N, ctx)) and scores d[1] ...;
// each later window scores the next `stride` tokens (stride <= ctx - 1; the default ctx - 1 gives
// non-overlapping windows) and fills the rest of its ctx tokens with the tokens just before them as
// context. A later window starts with BOS (when the document does) followed by the text, so every
// window looks like a document start. Every target d[j], j >= 1, is scored exactly once.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"

namespace cedar::runtime {

struct EvalWindow {
  size_t begin = 0, end = 0;  // document tokens [begin, end)
  bool bos_prefix = false;    // the window is BOS + d[begin, end)
  size_t score_from = 0;      // targets d[score_from, end) are scored in this window
  size_t size() const { return end - begin + (bos_prefix ? 1 : 0); }
  // Window row whose logits predict d[j] (the row of d[j - 1]).
  size_t row_of_target(size_t j) const { return j - 1 - begin + (bos_prefix ? 1 : 0); }
};

// The windows of a document of n_tokens tokens (n_tokens >= 2). has_bos: d[0] is BOS, which later
// windows then repeat. stride 0 = ctx - 1. Errors: ctx < 2, stride > ctx - 1.
Result<std::vector<EvalWindow>> make_windows(size_t n_tokens, bool has_bos, int ctx, int stride);

// How each window runs through the model.
enum class EvalPath {
  kCold,     // the whole window in one prefill call (position 0); every row's logits
  kSplit,    // its first `resume_at` tokens in one prefill call, then the rest as one continuation
             // chunk (the decode path): what a prompt followed by decoding computes
  kBounded,  // as kSplit, but the continuation resumes from the prefix cache: the prefix is computed
             // and saved, a fresh sequence restores it with bounded replay (spec §8) and runs the
             // replayed tokens and the continuation in one chunk
};

struct EvalOptions {
  int ctx = 512;
  int stride = 0;      // 0: ctx - 1 (non-overlapping windows)
  EvalPath path = EvalPath::kCold;
  int resume_at = 0;   // kSplit / kBounded: the split point in each window (0: ctx / 2)
};

// Scores of a document's targets, in order. With kSplit / kBounded only the targets at or after each
// window's split point are scored (the prefill's earlier rows do not reach the head).
struct TokenScores {
  std::vector<int32_t> position;  // j: the target is d[j]
  std::vector<double> logprob;    // log p(d[j] | context), natural log
  std::vector<int32_t> argmax;    // the model's top-1 at that row (ties: lower id)
};

struct EvalWork {                  // what the runs computed, for the KV-economy table
  uint64_t windows = 0;
  uint64_t prefill_tokens = 0;     // tokens run through prefill calls
  uint64_t continuation_tokens = 0;
  uint64_t prefix_tokens = 0;      // kSplit / kBounded: tokens before the split points
  uint64_t replayed_tokens = 0;    // kBounded: prefix tokens run again after the restore
  double seconds = 0;
};

// Scores one document (token ids, d[0] the first). vocab: the softmax domain (the sampleable
// vocabulary). progress(n) is called after each window with the number of targets it scored.
Result<TokenScores> score_document(model::Model& model, std::span<const int32_t> doc, bool has_bos,
                                   const EvalOptions& options, ThreadPool* pool, EvalWork* work,
                                   const std::function<void(size_t)>& progress = {});

struct ScoreSummary {
  uint64_t tokens = 0;
  double nll_sum = 0;       // sum of -log p
  uint64_t correct = 0;     // top-1 == target
  double cross_entropy() const { return tokens ? nll_sum / static_cast<double>(tokens) : 0.0; }
  double perplexity() const;
  double top1() const { return tokens ? static_cast<double>(correct) / static_cast<double>(tokens) : 0.0; }
  void add(const TokenScores& s, std::span<const int32_t> doc);
};

// A variant against the reference on the same targets (same positions, in order).
struct ScoreComparison {
  uint64_t tokens = 0;
  double delta_nll_sum = 0;   // sum of (-log p_variant) - (-log p_reference)
  uint64_t agree = 0;         // top-1 of the two agree
  double delta_cross_entropy() const { return tokens ? delta_nll_sum / static_cast<double>(tokens) : 0.0; }
  double agreement() const { return tokens ? static_cast<double>(agree) / static_cast<double>(tokens) : 0.0; }
  // Errors: the two score different targets.
  Status add(const TokenScores& reference, const TokenScores& variant);
};

}  // namespace cedar::runtime
