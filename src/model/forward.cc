// The V4.1 forward pass, top level: it reads like Transformer.forward and Block.forward of the
// official inference/model.py. Attention and MoE live in forward_attention.cc / forward_moe.cc.
#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "model/forward_internal.h"
#include "model/mhc_mixes.h"
#include "ops/formats/formats.h"
#include "ops/block/hc.h"
#include "ops/linear/linear.h"
#include "ops/block/norm.h"

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
  // Image spans: the ViT + aligner rows of every span this round reaches (once per span), and the
  // image mask (token_types >= 0) by row.
  uint8_t* image_rows = scratch(ws_->image_rows, T);
  std::memset(image_rows, 0, T);
  ws_->any_image = false;
  for (const ChunkSpan& s : spans) {
    if (!s.images || s.images->empty()) continue;
    CEDAR_RETURN_IF_ERROR(encode_image_spans(*s.images, s.p0, s.p0 + static_cast<int64_t>(s.n), pool));
    for (size_t t = 0; t < s.n; ++t)
      if (s.images->span_at(s.p0 + static_cast<int64_t>(t)) >= 0) image_rows[s.offset + t] = 1, ws_->any_image = true;
  }
  // Engram row ids for every new token (Transformer.forward computes them before the first layer);
  // image positions take part in no n-gram (engram_mask = ~image_mask).
  if (engram_hasher_) {
    const size_t per_token = static_cast<size_t>(engram_hasher_->n_layers()) * engram_hasher_->n_columns();
    int64_t* rows = scratch(ws_->engram_rows, T * per_token);
    uint8_t* takes_part = scratch(ws_->engram_takes_part, T);
    for (size_t t = 0; t < T; ++t) takes_part[t] = image_rows[t] ? 0 : 1;
    for (const ChunkSpan& s : spans) {
      std::span<const uint8_t> part;
      if (ws_->any_image) part = {takes_part + s.offset, s.n};
      CEDAR_RETURN_IF_ERROR(engram_hasher_->hash(s.seq->engram, s.p0, {s.tokens, s.n}, part,
                                                 {rows + s.offset * per_token, s.n * per_token}));
    }
    // Row ids depend on token ids only: their reads start now, before the first layer runs.
    source_->will_need_rows({rows, T * per_token}, per_token, engram_hasher_->n_columns());
  }
  // Room in the KV home for the new positions (a replay re-runs positions the home already holds:
  // their ids must be the same).
  for (const ChunkSpan& s : spans) {
    kv::Sequence& kv = s.seq->kv();
    const int64_t held = std::min<int64_t>(kv.n_tokens() - s.p0, static_cast<int64_t>(s.n));
    for (int64_t i = 0; i < held; ++i)
      if (kv.tokens()[s.p0 + i] != s.tokens[i])
        return invalid_argument("forward: position " + std::to_string(s.p0 + i) +
                                " differs from the id the sequence's restored prefix holds");
    if (held < static_cast<int64_t>(s.n))
      CEDAR_RETURN_IF_ERROR(s.seq->home().append(kv, {s.tokens + std::max<int64_t>(held, 0), s.n - std::max<int64_t>(held, 0)}));
  }
  std::vector<ChunkSpan> original = spans;
  ForwardPass pass(*this, spans, T, pool);
  pass.run(logits, sink, sink_base);
  // A streaming read that failed left zeros in its slot: the step's output is void.
  CEDAR_RETURN_IF_ERROR(source_->error());
  CEDAR_RETURN_IF_ERROR(exchange_error_);  // a rank of the expert exchange failed: the output is void
  for (const ChunkSpan& s : original) s.seq->n_tokens += static_cast<int64_t>(s.n);
  return {};
}

ForwardPass::ForwardPass(Model& m, std::vector<ChunkSpan>& chunks, size_t n_tokens, ThreadPool* pool)
    : m_(m), c_(m.config_), plan_(m.plan_), w_(*m.weights_), ws_(*m.ws_), chunks_(chunks), T_(n_tokens),
      pool_(pool), k_(m.kernels()), hc_dim_(static_cast<size_t>(m.config_.hc_mult) * m.config_.dim),
      chunks_original_p0_(chunks.empty() ? 0 : chunks[0].p0) {
  ws_.published_topk_layer = -1;
  ++ws_.pass;  // dequantised index keys are re-validated once per pass (dequantized_index_keys)
  // The candidate pool is kept as one flag per block of candidate_block_size entries, for every row;
  // a row never has more entries than its sequence has positions.
  ws_.candidate_width = 0;
  if (c_.candidate_source_layer >= 0) {
    int64_t max_pos = 0;
    for (const ChunkSpan& ch : chunks_) max_pos = std::max<int64_t>(max_pos, ch.p0 + static_cast<int64_t>(ch.n));
    ws_.candidate_width = static_cast<size_t>((max_pos + c_.candidate_block_size - 1) / c_.candidate_block_size);
    scratch(ws_.candidates, T_ * ws_.candidate_width);
  }
}

int ForwardPass::reference_slot(const ChunkSpan& ch, int l, int64_t i) const {
  const auto& owners = plan_.kv_owner_layers;
  // An owner publishes at decode position j when its group completes: (j + 1) % ratio == 0.
  auto publishes = [&](int owner, int64_t j) { return (j + 1) % plan_.layers[owner].compress_ratio == 0; };
  for (auto it = owners.rbegin(); it != owners.rend(); ++it)
    if (*it <= l && publishes(*it, i)) return *it;
  for (int64_t j = i - 1; j >= ch.p0; --j)
    for (auto it = owners.rbegin(); it != owners.rend(); ++it)
      if (publishes(*it, j)) return *it;
  return ch.start_index_key_slot;
}

const ops::RopeTable& ForwardPass::rope_for(int layer) const {
  return plan_.layers[layer].compress_ratio > 0 ? *m_.rope_compressed_ : *m_.rope_swa_;
}

void ForwardPass::run(float* logits, const RowLogitsSink* sink, size_t sink_base) {
  embed();
  const int last_kv_source = plan_.kv_owner_layers.empty() ? -1 : plan_.kv_owner_layers.back();
  for (int l = 0; l < c_.n_layers; ++l) {
    if (plan_.layers[l].engram) engram(l);
    if (const int target = m_.dspark_hook_.target_index(l); target >= 0)  // DSpark reads the attention input
      for (size_t i = 0; i < chunks_.size(); ++i)
        m_.dspark_hook_.capture(target, i, chunks_[i].p0, chunks_[i].n, &ws_.streams[chunks_[i].offset * hc_dim_]);
    block(l);
    if (l == last_kv_source && m_.options_.decoder_narrowing) narrow_to_tail(c_.window_size);
    if (m_.observer_) {
      std::vector<float> last(chunks_.size() * hc_dim_);
      for (size_t i = 0; i < chunks_.size(); ++i)
        std::memcpy(&last[i * hc_dim_], &ws_.streams[(chunks_[i].offset + chunks_[i].n - 1) * hc_dim_],
                    hc_dim_ * sizeof(float));
      m_.observer_(l, last.data(), chunks_.size());
    }
  }
  if (sink) head_all_rows(*sink, sink_base);
  else head(logits);
  // After a decode chunk the slot is what the last token's forward left published.
  for (const ChunkSpan& ch : chunks_)
    if (!ch.prefill) ch.seq->index_key_slot = reference_slot(ch, c_.n_layers - 1, ch.p0 + static_cast<int64_t>(ch.n) - 1);
}

// CED decoder narrowing: prefill chunks keep only their last `tail` tokens for the layers after the
// last KV source. Streams, pre-mixes, the published top-k (re-offset to the shorter window operand)
// and the candidate pool rows move with them; decode chunks are untouched.
void ForwardPass::narrow_to_tail(size_t tail) {
  const size_t hc = c_.hc_mult;
  const size_t topk_w = ws_.published_topk_width, cand_w = ws_.candidate_width;
  size_t out = 0;
  for (ChunkSpan& ch : chunks_) {
    const size_t keep = ch.prefill ? std::min(ch.n, tail) : ch.n;
    const size_t drop = ch.n - keep;
    for (size_t t = 0; t < keep; ++t) {
      const size_t from = ch.offset + drop + t, to = out + t;
      if (from == to) continue;
      std::memmove(&ws_.streams[to * hc_dim_], &ws_.streams[from * hc_dim_], hc_dim_ * sizeof(float));
      std::memmove(&ws_.pre_mix[to * hc], &ws_.pre_mix[from * hc], hc * sizeof(float));
      ws_.image_rows[to] = ws_.image_rows[from];
      if (topk_w) std::memmove(&ws_.published_topk[to * topk_w], &ws_.published_topk[from * topk_w], topk_w * sizeof(int32_t));
      if (cand_w) std::memmove(&ws_.candidates[to * cand_w], &ws_.candidates[from * cand_w], cand_w);
    }
    if (ch.prefill && drop && topk_w) {
      // Compressed indices were offset by the old window operand length (ch.n); now it is `keep`.
      for (size_t t = 0; t < keep; ++t) {
        int32_t* pub = &ws_.published_topk[(out + t) * topk_w];
        for (int32_t j = 0; j < pub[0]; ++j)
          if (pub[1 + j] >= 0) pub[1 + j] = pub[1 + j] - static_cast<int32_t>(ch.n) + static_cast<int32_t>(keep);
      }
    }
    ch.p0 += static_cast<int64_t>(drop);
    ch.tokens += drop;
    ch.offset = out;
    ch.n = keep;
    out += keep;
  }
  T_ = out;
}

// h = embed(ids), with image spans' rows merged in (merge_image_embeddings), expanded into hc_mult
// identical streams; the first pre-mix is the one-hot on stream 0.
void ForwardPass::embed() {
  const size_t dim = c_.dim, hc = c_.hc_mult;
  float* X = scratch(ws_.streams, T_ * hc_dim_);  // [T, hc, dim]
  float* pre = scratch(ws_.pre_mix, T_ * hc);      // [T, hc]
  for (const ChunkSpan& ch : chunks_)
    for (size_t t = 0; t < ch.n; ++t) {
      const size_t row = ch.offset + t;
      const int64_t pos = ch.p0 + static_cast<int64_t>(t);
      const int span = ws_.image_rows[row] ? ch.images->span_at(pos) : -1;
      if (span >= 0) {
        const ImageSpan& s = ch.images->spans[span];
        const float* e = ch.images->embeddings[span].data() + static_cast<size_t>(pos - s.start) * dim;
        std::memcpy(X + row * hc_dim_, e, dim * sizeof(float));
      } else {
        const uint16_t* e = w_.embed.bits + static_cast<size_t>(ch.tokens[t]) * dim;
        ops::bf16_to_f32(e, X + row * hc_dim_, dim);
      }
      for (size_t j = 1; j < hc; ++j) std::memcpy(X + row * hc_dim_ + j * dim, X + row * hc_dim_, dim * sizeof(float));
      for (size_t j = 0; j < hc; ++j) pre[row * hc + j] = j == 0 ? 1.0f : 0.0f;
    }
}

// Block.forward with single-pass mHC: attention consumes the pre-mix the previous FFN produced,
// the FFN consumes the one this attention produced; post / comb are used at once.
void ForwardPass::block(int l) {
  const BlockWeights& bw = w_.blocks[l];
  const size_t dim = c_.dim, hc = c_.hc_mult, n_mix = (2 + hc) * hc;
  const float eps = static_cast<float>(c_.norm_eps);
  scratch(ws_.residual, T_ * hc_dim_);
  float* mixes = scratch(ws_.mixes, T_ * n_mix);    // [T, 24]
  float* attn_pre = scratch(ws_.attn_pre, T_ * hc); // [T, hc]
  float* post = scratch(ws_.post, T_ * hc);         // [T, hc]
  float* comb = scratch(ws_.comb, T_ * hc * hc);    // [T, hc, hc]
  float* x = scratch(ws_.x, T_ * dim);              // [T, dim]
  float* y = scratch(ws_.y, T_ * dim);              // [T, dim]

  // Attention sub-layer. residual <- X; the new X is written into the other buffer.
  std::swap(ws_.streams, ws_.residual);
  const float* R = ws_.residual.data();              // [T, hc, dim]
  float* X = scratch(ws_.streams, T_ * hc_dim_);
  mhc_mixes(k_, c_, R, T_, bw.hc_attn_fn, bw.hc_attn_scale, bw.hc_attn_base, mixes, attn_pre, post, comb, pool_);
  ops::hc_pre(R, ws_.pre_mix.data(), T_, c_.hc_mult, dim, x);
  ops::rms_norm(x, T_, dim, bw.attn_norm, eps, x);
  attention(l, x, y);
  ops::hc_post(y, R, post, comb, T_, c_.hc_mult, dim, X);

  // FFN sub-layer.
  std::swap(ws_.streams, ws_.residual);
  R = ws_.residual.data();
  X = ws_.streams.data();
  float* ffn_pre = ws_.pre_mix.data();  // becomes the next block's attention pre-mix
  mhc_mixes(k_, c_, R, T_, bw.hc_ffn_fn, bw.hc_ffn_scale, bw.hc_ffn_base, mixes, ffn_pre, post, comb, pool_);
  ops::hc_pre(R, attn_pre, T_, c_.hc_mult, dim, x);
  ops::rms_norm(x, T_, dim, bw.ffn_norm, eps, x);
  moe(l, x, y);
  ops::hc_post(y, R, post, comb, T_, c_.hc_mult, dim, X);
}

// Final collapse with the last FFN's pre-mix, norm, and fp32 logits of each chunk's last token.
void ForwardPass::head(float* logits) {
  const size_t dim = c_.dim;
  std::vector<float>& xv = ws_.x;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const size_t row = chunks_[i].offset + chunks_[i].n - 1;
    float* x = scratch(xv, dim);  // [dim]
    ops::hc_pre(ws_.streams.data() + row * hc_dim_, ws_.pre_mix.data() + row * c_.hc_mult, 1, c_.hc_mult, dim, x);
    ops::rms_norm(x, 1, dim, w_.norm, static_cast<float>(c_.norm_eps), x);
    k_.linear_bf16(x, 1, w_.head, logits + i * static_cast<size_t>(c_.vocab_size), ops::LinearOut::kF32, pool_);
  }
}

// head() for every row of the (single) chunk, kRowBlock rows per head GEMM: each row's collapse, norm
// and logits are computed as head() computes a last row (per-row ops), so in exact numerics they are
// bit-identical; fast numerics sum the GEMM of a block of rows in another order than the GEMV of one.
void ForwardPass::head_all_rows(const RowLogitsSink& sink, size_t sink_base) {
  constexpr size_t kRowBlock = 16;
  const size_t dim = c_.dim, vocab = c_.vocab_size;
  const ChunkSpan& ch = chunks_[0];
  // Rows narrowing dropped are missing: ch.tokens moved forward by that many.
  const size_t first_row = sink_base + static_cast<size_t>(ch.p0 - chunks_original_p0_);
  float* x = scratch(ws_.x, kRowBlock * dim);
  float* out = scratch(ws_.row_logits, kRowBlock * vocab);
  for (size_t r0 = 0; r0 < ch.n; r0 += kRowBlock) {
    const size_t n = std::min(kRowBlock, ch.n - r0);
    const size_t row = ch.offset + r0;
    ops::hc_pre(ws_.streams.data() + row * hc_dim_, ws_.pre_mix.data() + row * c_.hc_mult, n, c_.hc_mult, dim, x);
    ops::rms_norm(x, n, dim, w_.norm, static_cast<float>(c_.norm_eps), x);
    k_.linear_bf16(x, n, w_.head, out, ops::LinearOut::kF32, pool_);
    sink(first_row + r0, n, out);
  }
}

}  // namespace cedar::model
