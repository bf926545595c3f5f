#include "model/transformer.h"

#include <algorithm>
#include <cstring>

#include "model/decoder_narrowing.h"
#include "ops/formats/formats.h"
#include "ops/block/hc.h"
#include "ops/linear/linear.h"
#include "ops/block/norm.h"

namespace cedar::model {

Transformer::Transformer(const ModelParts& m, const ModelOptions& o, const NgramHasher* hasher, bool lookahead)
    : m_(m), block_(m_, o.kv_dtype, o.index_keys, lookahead), engram_(m_, hasher) {
  set_decoder_narrowing(o.decoder_narrowing);
}

void Transformer::set_decoder_narrowing(bool on) {
  narrow_after_ = on && !m_.plan.kv_owner_layers.empty() ? m_.plan.kv_owner_layers.back() : -1;
}

Status Transformer::prepare(const std::vector<ChunkSpan>& chunks, size_t T) {
  uint8_t* image_rows = scratch(image_rows_, T);
  std::memset(image_rows, 0, T);
  any_image_ = false;
  for (const ChunkSpan& s : chunks)
    for (size_t t = 0; s.images && !s.images->empty() && t < s.n; ++t)
      if (s.images->span_at(s.p0 + static_cast<int64_t>(t)) >= 0) image_rows[s.offset + t] = 1, any_image_ = true;
  return engram_.hash(chunks, T, image_rows, any_image_);
}

void Transformer::forward(std::vector<ChunkSpan>& chunks, size_t T, ThreadPool* pool, const ops::KernelSet& k,
                          DsparkHook& dspark, const LayerObserver& observer, float* logits, const RowLogitsSink* sink,
                          size_t sink_base) {
  const size_t hc_dim = static_cast<size_t>(m_.c.hc_mult) * m_.c.dim;
  const int64_t original_p0 = chunks.empty() ? 0 : chunks[0].p0;
  Batch b{chunks, T, pool, k, image_rows_.data(), any_image_};
  csa2_.begin_pass(chunks, T, m_.c);
  embed(b);
  for (int l = 0; l < m_.c.n_layers; ++l) {
    if (m_.plan.layers[l].engram) engram_.forward(l, b, streams_.data());
    if (const int target = dspark.target_index(l); target >= 0)  // DSpark reads the attention input
      for (size_t i = 0; i < chunks.size(); ++i)
        dspark.capture(target, i, chunks[i].p0, chunks[i].n, &streams_[chunks[i].offset * hc_dim]);
    block_.forward(l, b, csa2_, streams_, pre_mix_);
    if (l == narrow_after_)
      b.T = narrow_to_tail(chunks, m_.c.window_size, m_.c.hc_mult, m_.c.dim, streams_.data(), pre_mix_.data(),
                           image_rows_.data(), csa2_);
    if (observer) {
      float* last = scratch(observed_, chunks.size() * hc_dim);
      for (size_t i = 0; i < chunks.size(); ++i)
        std::memcpy(&last[i * hc_dim], &streams_[(chunks[i].offset + chunks[i].n - 1) * hc_dim], hc_dim * sizeof(float));
      observer(l, last, chunks.size());
    }
  }
  // Rows narrowing dropped never reach the head: the chunk's tokens moved forward by that many.
  if (sink) head_all_rows(b, *sink, sink_base + static_cast<size_t>(chunks[0].p0 - original_p0));
  else head(b, logits);
  // After a decode chunk the slot is what the last token's forward left published.
  for (const ChunkSpan& ch : chunks)
    if (!ch.prefill)
      ch.seq->index_key_slot = reference_index_key_slot(m_.plan, ch, m_.c.n_layers - 1, ch.p0 + static_cast<int64_t>(ch.n) - 1);
}

// h = embed(ids), with image spans' rows merged in (merge_image_embeddings), expanded into hc_mult
// identical streams; the first pre-mix is the one-hot on stream 0.
void Transformer::embed(const Batch& b) {
  const size_t dim = m_.c.dim, hc = m_.c.hc_mult, hc_dim = hc * dim;
  float* X = scratch(streams_, b.T * hc_dim);  // [T, hc, dim]
  float* pre = scratch(pre_mix_, b.T * hc);    // [T, hc]
  for (const ChunkSpan& ch : b.chunks)
    for (size_t t = 0; t < ch.n; ++t) {
      const size_t row = ch.offset + t;
      const int64_t pos = ch.p0 + static_cast<int64_t>(t);
      const int span = b.image_rows[row] ? ch.images->span_at(pos) : -1;
      if (span >= 0) {
        const ImageSpan& s = ch.images->spans[span];
        const float* e = ch.images->embeddings[span].data() + static_cast<size_t>(pos - s.start) * dim;
        std::memcpy(X + row * hc_dim, e, dim * sizeof(float));
      } else {
        ops::bf16_to_f32(m_.w.embed.bits + static_cast<size_t>(ch.tokens[t]) * dim, X + row * hc_dim, dim);
      }
      for (size_t j = 1; j < hc; ++j) std::memcpy(X + row * hc_dim + j * dim, X + row * hc_dim, dim * sizeof(float));
      for (size_t j = 0; j < hc; ++j) pre[row * hc + j] = j == 0 ? 1.0f : 0.0f;
    }
}

// Final collapse with the last FFN's pre-mix, norm, and fp32 logits of each chunk's last token.
void Transformer::head(const Batch& b, float* logits) {
  const size_t dim = m_.c.dim, hc = m_.c.hc_mult;
  float* x = scratch(x_, dim);  // [dim]
  for (size_t i = 0; i < b.chunks.size(); ++i) {
    const size_t row = b.chunks[i].offset + b.chunks[i].n - 1;
    ops::hc_pre(streams_.data() + row * hc * dim, pre_mix_.data() + row * hc, 1, m_.c.hc_mult, dim, x);
    ops::rms_norm(x, 1, dim, m_.w.norm, static_cast<float>(m_.c.norm_eps), x);
    b.k.linear_bf16(x, 1, m_.w.head, logits + i * static_cast<size_t>(m_.c.vocab_size), ops::LinearOut::kF32, b.pool);
  }
}

// head() for every row of the (single) chunk, kRowBlock rows per head GEMM: each row's collapse, norm
// and logits are computed as head() computes a last row (per-row ops), so in exact numerics they are
// bit-identical; fast numerics sum the GEMM of a block of rows in another order than the GEMV of one.
void Transformer::head_all_rows(const Batch& b, const RowLogitsSink& sink, size_t first_row) {
  constexpr size_t kRowBlock = 16;
  const size_t dim = m_.c.dim, hc = m_.c.hc_mult, vocab = m_.c.vocab_size;
  const ChunkSpan& ch = b.chunks[0];
  float* x = scratch(x_, kRowBlock * dim);
  float* out = scratch(row_logits_, kRowBlock * vocab);
  for (size_t r0 = 0; r0 < ch.n; r0 += kRowBlock) {
    const size_t n = std::min(kRowBlock, ch.n - r0);
    const size_t row = ch.offset + r0;
    ops::hc_pre(streams_.data() + row * hc * dim, pre_mix_.data() + row * hc, n, m_.c.hc_mult, dim, x);
    ops::rms_norm(x, n, dim, m_.w.norm, static_cast<float>(m_.c.norm_eps), x);
    b.k.linear_bf16(x, n, m_.w.head, out, ops::LinearOut::kF32, b.pool);
    sink(first_row + r0, n, out);
  }
}

}  // namespace cedar::model
