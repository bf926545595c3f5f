// Model's forward calls around the Transformer (transformer.h): the chunks checked, split into rounds
// where the reference's index-key slot needs it, each round's image spans encoded, its Engram rows
// hashed and its KV room made, then the pass run and the sequences advanced. Also the mode setters,
// which re-resolve the Transformer's strategies. Support, not a model.py class.
#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "model/transformer.h"

namespace cedar::model {

Status Model::check_chunks(std::span<const SeqChunk> chunks) const {
  if (chunks.empty()) return invalid_argument("forward: no sequences");
  for (const SeqChunk& ch : chunks) {
    if (!ch.seq || !ch.seq->valid()) return invalid_argument("forward: null sequence");
    if (ch.seq->kv_dtype != options_.kv_dtype)
      return invalid_argument("forward: the sequence's KV format differs from the model's (made before set_kv_dtype)");
    if (ch.tokens.empty()) return invalid_argument("forward: a sequence has no tokens to process");
    if (ch.seq->n_tokens + static_cast<int64_t>(ch.tokens.size()) > ch.seq->capacity)
      return invalid_argument("forward: sequence of " + std::to_string(ch.seq->n_tokens + ch.tokens.size()) +
                              " tokens exceeds its capacity " + std::to_string(ch.seq->capacity));
    for (int32_t id : ch.tokens)
      if (id < 0 || id >= config_.vocab_size)
        return invalid_argument("forward: token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(config_.vocab_size) + ")");
    for (size_t i = 0; i + 1 < chunks.size(); ++i)
      for (size_t j = i + 1; j < chunks.size(); ++j)
        if (chunks[i].seq == chunks[j].seq) return invalid_argument("forward: a sequence appears twice in one batch");
    if (ch.images) CEDAR_RETURN_IF_ERROR(check_images(*ch.images, ch.tokens, ch.seq->n_tokens));
  }
  return {};
}

Status Model::forward(std::span<const SeqChunk> chunks, float* logits, ThreadPool* pool) {
  CEDAR_RETURN_IF_ERROR(check_chunks(chunks));
  return forward_rounds(chunks, logits, nullptr, pool);
}

Status Model::forward_all_rows(const SeqChunk& chunk, const RowLogitsSink& sink, ThreadPool* pool) {
  CEDAR_RETURN_IF_ERROR(check_chunks({&chunk, 1}));
  if (!sink) return invalid_argument("forward_all_rows: no sink");
  return forward_rounds({&chunk, 1}, nullptr, &sink, pool);
}

Status Model::forward_rounds(std::span<const SeqChunk> chunks, float* logits, const RowLogitsSink* sink,
                             ThreadPool* pool) {
  // A chunk after position 0 is split into pieces of at most p0 + 1 tokens when the reference's
  // index-key slot is reproduced: a ratio-2 indexer at an even position then reads layer 20's keys
  // of earlier positions only, which an earlier piece has produced (spec §9.1, NUMERICS.md).
  std::vector<size_t> done(chunks.size(), 0);
  std::vector<SeqChunk> round;
  std::vector<size_t> round_of;
  std::vector<float> round_logits;
  const size_t vocab = config_.vocab_size;
  if (dspark_hook_.enabled()) dspark_hook_.begin_forward(chunks.size());
  for (;;) {
    round.clear();
    round_of.clear();
    for (size_t i = 0; i < chunks.size(); ++i) {
      const size_t left = chunks[i].tokens.size() - done[i];
      if (left == 0) continue;
      const int64_t p0 = chunks[i].seq->n_tokens;
      size_t take = left;
      if (p0 > 0 && options_.index_keys == IndexKeyMode::kReference) take = std::min<size_t>(left, p0 + 1);
      round.push_back({chunks[i].seq, chunks[i].tokens.subspan(done[i], take), chunks[i].images});
      round_of.push_back(i);
      done[i] += take;
    }
    if (round.empty()) break;
    dspark_hook_.set_round_map(&round_of);
    if (sink) {  // one chunk: its rows go to the sink, offset by the tokens of earlier rounds
      CEDAR_RETURN_IF_ERROR(forward_round(round, nullptr, sink, done[0] - round[0].tokens.size(), pool));
      continue;
    }
    round_logits.resize(round.size() * vocab);
    CEDAR_RETURN_IF_ERROR(forward_round(round, round_logits.data(), nullptr, 0, pool));
    for (size_t r = 0; r < round.size(); ++r)
      if (done[round_of[r]] == chunks[round_of[r]].tokens.size())
        std::memcpy(logits + round_of[r] * vocab, round_logits.data() + r * vocab, vocab * sizeof(float));
  }
  return {};
}

Status Model::forward_round(std::span<const SeqChunk> chunks, float* logits, const RowLogitsSink* sink,
                            size_t sink_base, ThreadPool* pool) {
  std::vector<ChunkSpan> spans;
  spans.reserve(chunks.size());
  size_t T = 0;
  for (const SeqChunk& ch : chunks) {
    spans.push_back({ch.seq, ch.tokens.data(), ch.seq->n_tokens, T, ch.tokens.size(), ch.seq->index_key_slot,
                     ch.seq->n_tokens == 0, ch.images});
    T += ch.tokens.size();
  }
  // Image spans: the ViT + aligner rows of every span this round reaches (once per span); then the
  // image mask by row and the Engram row ids (Transformer.forward computes them before the first layer).
  for (const ChunkSpan& s : spans)
    if (s.images && !s.images->empty())
      CEDAR_RETURN_IF_ERROR(encode_image_spans(*s.images, s.p0, s.p0 + static_cast<int64_t>(s.n), pool));
  CEDAR_RETURN_IF_ERROR(transformer_->prepare(spans, T));
  // Room in the KV home for the new positions (a replay re-runs positions the home already holds:
  // their ids must be the same). Image positions are recorded by their key ids (image_spans.h).
  std::vector<int32_t> keyed;
  for (const ChunkSpan& s : spans) {
    kv::Sequence& kv = s.seq->kv();
    const int32_t* ids = s.tokens;
    if (s.images && !s.images->empty()) {
      keyed.assign(s.tokens, s.tokens + s.n);
      key_image_positions(*s.images, s.p0, keyed);
      ids = keyed.data();
    }
    const int64_t held = std::min<int64_t>(kv.n_tokens() - s.p0, static_cast<int64_t>(s.n));
    for (int64_t i = 0; i < held; ++i)
      if (kv.tokens()[s.p0 + i] != ids[i])
        return invalid_argument("forward: position " + std::to_string(s.p0 + i) +
                                " differs from the id the sequence's restored prefix holds");
    if (held < static_cast<int64_t>(s.n))
      CEDAR_RETURN_IF_ERROR(s.seq->home().append(kv, {ids + std::max<int64_t>(held, 0), s.n - std::max<int64_t>(held, 0)}));
  }
  std::vector<ChunkSpan> original = spans;
  transformer_->forward(spans, T, pool, kernels(), dspark_hook_, observer_, logits, sink, sink_base);
  // A streaming read that failed left zeros in its slot: the step's output is void.
  CEDAR_RETURN_IF_ERROR(source_->error());
  CEDAR_RETURN_IF_ERROR(exchange_error_);  // a rank of the expert exchange failed: the output is void
  for (const ChunkSpan& s : original) s.seq->n_tokens += static_cast<int64_t>(s.n);
  return {};
}

void Model::set_index_key_mode(IndexKeyMode m) {
  options_.index_keys = m;
  transformer_->set_index_key_mode(m);
}

void Model::set_decoder_narrowing(bool on) {
  options_.decoder_narrowing = on;
  transformer_->set_decoder_narrowing(on);
}

void Model::set_expert_exchange(ExpertExchange* exchange) {
  exchange_ = exchange;
  transformer_->set_expert_exchange(exchange, &exchange_error_);
}

LookaheadStats Model::lookahead_stats() const {
  const ExpertLookahead& l = transformer_->lookahead();
  return {l.predicted(), l.correct()};
}

void Model::reset_residency_stats() {
  source_->reset_stats();
  transformer_->lookahead().reset();
}

}  // namespace cedar::model
