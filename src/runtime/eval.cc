#include "runtime/eval.h"

#include <algorithm>
#include <cmath>

#include "core/timer.h"
#include "ops/sample/logprob.h"
#include "ops/sample/sample.h"
#include "runtime/prefix_store.h"

namespace cedar::runtime {

Result<std::vector<EvalWindow>> make_windows(size_t n_tokens, bool has_bos, int ctx, int stride) {
  if (ctx < 2) return invalid_argument("--ctx must be at least 2 (a window holds a token and its successor)");
  if (stride == 0) stride = ctx - 1;
  if (stride < 1 || stride > ctx - 1)
    return invalid_argument("--stride must be between 1 and ctx - 1 = " + std::to_string(ctx - 1));
  if (n_tokens < 2) return invalid_argument("the document has fewer than two tokens: nothing to score");
  std::vector<EvalWindow> out;
  const size_t c = static_cast<size_t>(ctx), s = static_cast<size_t>(stride);
  EvalWindow first;
  first.begin = 0;
  first.end = std::min(n_tokens, c);
  first.score_from = 1;
  out.push_back(first);
  // A later window: BOS + the text before its end (ctx - 1 tokens), or ctx text tokens without BOS.
  const size_t span = has_bos ? c - 1 : c;
  for (size_t scored = first.end; scored < n_tokens;) {
    EvalWindow w;
    w.end = std::min(n_tokens, scored + s);
    w.begin = w.end > span ? w.end - span : 0;
    w.bos_prefix = has_bos && w.begin > 0;
    w.score_from = scored;
    out.push_back(w);
    scored = w.end;
  }
  return out;
}

namespace {

// Scores window rows as the model hands them over: row q predicts window token q + 1; targets with
// window index in [lo, len) are kept, in order.
class RowScorer {
 public:
  RowScorer(std::span<const int32_t> window, size_t lo, size_t vocab, size_t stride)
      : window_(window), lo_(lo), vocab_(vocab), stride_(stride), logprob_(window.size(), NAN),
        argmax_(window.size(), -1) {}
  void rows(size_t first, size_t n, const float* logits) {
    for (size_t r = 0; r < n; ++r) {
      const size_t idx = first + r + 1;  // the target's window index
      if (idx < lo_ || idx >= window_.size()) continue;
      const float* row = logits + r * stride_;
      const ops::LogSoftmaxNorm z = ops::log_softmax_norm(row, vocab_);
      const int32_t target = window_[idx];
      // A target outside the sampleable vocabulary has probability 0 under the sampler's softmax.
      logprob_[idx] = static_cast<size_t>(target) < vocab_ ? z.log_prob(row, target) : -INFINITY;
      argmax_[idx] = ops::argmax(row, vocab_);
    }
  }
  // Appends the kept targets (document positions: window index + offset) to `out`.
  Status append(TokenScores& out, size_t window_to_doc) const {
    for (size_t idx = lo_; idx < window_.size(); ++idx) {
      if (argmax_[idx] < 0) return internal_error("eval: row " + std::to_string(idx - 1) + " was not scored");
      out.position.push_back(static_cast<int32_t>(idx + window_to_doc));
      out.logprob.push_back(logprob_[idx]);
      out.argmax.push_back(argmax_[idx]);
    }
    return {};
  }

 private:
  std::span<const int32_t> window_;
  size_t lo_, vocab_, stride_;
  std::vector<double> logprob_;
  std::vector<int32_t> argmax_;
};

}  // namespace

Result<TokenScores> score_document(model::Model& model, std::span<const int32_t> doc, bool has_bos,
                                   const EvalOptions& options, ThreadPool* pool, EvalWork* work,
                                   const std::function<void(size_t)>& progress) {
  CEDAR_ASSIGN_OR_RETURN(std::vector<EvalWindow> windows,
                         make_windows(doc.size(), has_bos, options.ctx, options.stride));
  EvalWork local;
  EvalWork& wk = work ? *work : local;
  const size_t vocab = model.sampleable_vocab(), stride = model.config().vocab_size;
  std::unique_ptr<PrefixStore> store;
  if (options.path == EvalPath::kBounded) {
    PrefixStoreOptions po;  // memory only
    po.live_blocks = 2 * kv::blocks_for_tokens(static_cast<int64_t>(options.ctx) + 2, po.block_tokens);
    CEDAR_ASSIGN_OR_RETURN(store, PrefixStore::create(model, po));
  }
  std::vector<float> last(stride);
  std::vector<int32_t> wt;
  TokenScores out;
  Timer timer;
  for (const EvalWindow& w : windows) {
    wt.clear();
    if (w.bos_prefix) wt.push_back(doc[0]);
    wt.insert(wt.end(), doc.begin() + static_cast<std::ptrdiff_t>(w.begin), doc.begin() + static_cast<std::ptrdiff_t>(w.end));
    const size_t len = wt.size();
    // window index + window_to_doc = document position (the BOS prefix is index 0 and never a target).
    const size_t window_to_doc = w.begin - (w.bos_prefix ? 1 : 0);
    size_t lo = w.row_of_target(w.score_from) + 1;
    size_t split = 0;
    if (options.path != EvalPath::kCold) {
      if (len < 3) {  // no room for a prefix and a continuation
        if (progress) progress(0);
        continue;
      }
      split = options.resume_at > 0 ? static_cast<size_t>(options.resume_at) : static_cast<size_t>(options.ctx) / 2;
      split = std::clamp<size_t>(split, 1, len - 2);
      lo = std::max(lo, split);
    }
    RowScorer scorer(wt, lo, vocab, stride);
    auto sink = [&](size_t first, size_t n, const float* logits) { scorer.rows(first, n, logits); };
    const std::span<const int32_t> tokens(wt.data(), len - 1);  // the last token predicts nothing here
    ++wk.windows;
    if (options.path == EvalPath::kCold) {
      model::SequenceState seq = model.new_sequence(static_cast<int64_t>(len));
      CEDAR_RETURN_IF_ERROR(model.forward_all_rows({&seq, tokens}, sink, pool));
      wk.prefill_tokens += tokens.size();
    } else if (options.path == EvalPath::kSplit) {
      model::SequenceState seq = model.new_sequence(static_cast<int64_t>(len));
      model::SeqChunk prefix{&seq, tokens.first(split)};
      CEDAR_RETURN_IF_ERROR(model.forward({&prefix, 1}, last.data(), pool));
      scorer.rows(split - 1, 1, last.data());
      const auto rest = [&](size_t first, size_t n, const float* logits) { scorer.rows(split + first, n, logits); };
      CEDAR_RETURN_IF_ERROR(model.forward_all_rows({&seq, tokens.subspan(split)}, rest, pool));
      wk.prefill_tokens += split;
      wk.prefix_tokens += split;
      wk.continuation_tokens += tokens.size() - split;
    } else {
      {
        CEDAR_ASSIGN_OR_RETURN(model::SequenceState first,
                               model.new_sequence(static_cast<int64_t>(split) + 1, store->cache()));
        model::SeqChunk prefix{&first, tokens.first(split)};
        CEDAR_RETURN_IF_ERROR(model.forward({&prefix, 1}, last.data(), pool));
        CEDAR_RETURN_IF_ERROR(store->save(first, static_cast<int64_t>(split)));
      }
      CEDAR_ASSIGN_OR_RETURN(model::SequenceState seq, model.new_sequence(static_cast<int64_t>(len), store->cache()));
      CEDAR_ASSIGN_OR_RETURN(ResumePlan plan, store->restore(tokens, ReplayMode::kBounded, seq));
      const size_t from = static_cast<size_t>(plan.replay_from);
      const auto rest = [&](size_t first, size_t n, const float* logits) { scorer.rows(from + first, n, logits); };
      CEDAR_RETURN_IF_ERROR(model.forward_all_rows({&seq, tokens.subspan(from)}, rest, pool));
      wk.prefix_tokens += split;
      wk.replayed_tokens += std::min(split, static_cast<size_t>(plan.cached_tokens)) - std::min(split, from);
      if (from == 0) wk.prefill_tokens += tokens.size();
      wk.continuation_tokens += tokens.size() - std::max(split, from);
    }
    const size_t before = out.position.size();
    CEDAR_RETURN_IF_ERROR(scorer.append(out, window_to_doc));
    if (progress) progress(out.position.size() - before);
  }
  wk.seconds += timer.seconds();
  return out;
}

double ScoreSummary::perplexity() const { return std::exp(cross_entropy()); }

void ScoreSummary::add(const TokenScores& s, std::span<const int32_t> doc) {
  for (size_t i = 0; i < s.position.size(); ++i) {
    ++tokens;
    nll_sum -= s.logprob[i];
    correct += s.argmax[i] == doc[static_cast<size_t>(s.position[i])];
  }
}

Status ScoreComparison::add(const TokenScores& reference, const TokenScores& variant) {
  if (reference.position != variant.position)
    return internal_error("eval: the variant scored other targets than the reference");
  for (size_t i = 0; i < reference.position.size(); ++i) {
    ++tokens;
    delta_nll_sum += reference.logprob[i] - variant.logprob[i];
    agree += reference.argmax[i] == variant.argmax[i];
  }
  return {};
}

}  // namespace cedar::runtime
