#include "model/engram.h"

#include <cstring>

#include "core/check.h"
#include "ops/linear/linear.h"

namespace cedar::model {

Status Engram::hash(const std::vector<ChunkSpan>& chunks, size_t T, const uint8_t* image_rows, bool any_image) {
  if (!hasher_) return {};
  const size_t per_token = static_cast<size_t>(hasher_->n_layers()) * hasher_->n_columns();
  int64_t* rows = scratch(rows_, T * per_token);
  uint8_t* takes_part = scratch(takes_part_, T);
  for (size_t t = 0; t < T; ++t) takes_part[t] = image_rows[t] ? 0 : 1;
  for (const ChunkSpan& s : chunks) {
    std::span<const uint8_t> part;
    if (any_image) part = {takes_part + s.offset, s.n};
    CEDAR_RETURN_IF_ERROR(hasher_->hash(s.seq->engram, s.p0, {s.tokens, s.n}, part,
                                        {rows + s.offset * per_token, s.n * per_token}));
  }
  // Row ids depend on token ids only: their reads start now, before the first layer runs.
  m_.source.will_need_rows({rows, T * per_token}, per_token, hasher_->n_columns());
  return {};
}

void Engram::forward(int l, const Batch& b, float* streams) {
  const size_t T = b.T;
  const int index = m_.plan.layers[l].engram_index;
  const EngramWeights& ew = m_.w.blocks[l].engram;
  const size_t n_cols = hasher_->n_columns(), hdim = m_.c.engram_head_dim, dim = m_.c.dim, hc = m_.c.hc_mult;
  const size_t per_token = static_cast<size_t>(hasher_->n_layers()) * n_cols, n_rows = T * n_cols;
  int64_t* layer_rows = scratch(layer_rows_, n_rows);  // [T, n_cols]
  for (size_t t = 0; t < T; ++t)
    std::memcpy(layer_rows + t * n_cols, rows_.data() + t * per_token + index * n_cols, n_cols * sizeof(int64_t));
  for (size_t i = 0; i < n_rows; ++i)
    CEDAR_CHECK(layer_rows[i] >= 0 && layer_rows[i] < ew.rows,
                "engram layer %d: row id %lld is outside the embedding table (%lld rows); the checkpoint's "
                "engram.embed does not match config.json's engram_* fields",
                l, static_cast<long long>(layer_rows[i]), static_cast<long long>(ew.rows));
  // The rows' bytes, gathered (from the mapping or the row cache), then dequantised as a small table.
  uint8_t* codes = scratch(codes_, n_rows * hdim);
  uint8_t* scales = scratch(scales_, n_rows * hdim / 32);
  m_.source.gather_rows(index, {layer_rows, n_rows}, codes, scales);
  int64_t* local = scratch(local_, n_rows);
  for (size_t i = 0; i < n_rows; ++i) local[i] = static_cast<int64_t>(i);
  float* E = scratch(e_, n_rows * hdim);  // [T, n_cols * head_dim]
  // The engine's pool, as every other op of the pass (the process-wide one for callers without).
  ThreadPool& pool = b.pool ? *b.pool : ThreadPool::global();
  Status st = dequant_engram_rows({codes, n_rows * hdim}, {scales, n_rows * hdim / 32}, static_cast<int64_t>(n_rows),
                                  static_cast<int>(hdim), {local, n_rows}, {E, n_rows * hdim}, pool);
  CEDAR_CHECK(st.ok(), "engram layer %d: %s", l, st.message().c_str());
  float* kv = scratch(kv_, T * (hc + 1) * dim);  // [T, (hc+1)*dim]
  float* act = scratch(act_, b.k.act_scratch_floats(T, n_cols * hdim));
  b.k.linear_fp8(E, T, ew.wkv, kv, {act, act_.size()}, b.pool);
  // token_mask: 0 at image-span rows (gate shut), empty for text only.
  std::span<const uint8_t> mask;
  if (b.any_image) {
    uint8_t* part = scratch(takes_part_, T);
    for (size_t t = 0; t < T; ++t) part[t] = b.image_rows[t] ? 0 : 1;
    mask = {part, T};
  }
  engram_gate_update({streams, T * hc * dim}, {kv, T * (hc + 1) * dim}, {ew.q_weight, hc * dim}, {ew.k_weight, hc * dim},
                     {static_cast<int64_t>(T), static_cast<int>(hc), static_cast<int>(dim)},
                     static_cast<float>(m_.c.norm_eps), mask, {}, pool, gate_);
}

}  // namespace cedar::model
