#include "model/compressor.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "model/sequence_journal.h"
#include "ops/simd/exact_math.h"
#include "ops/formats/formats.h"
#include "ops/block/norm.h"
#include "ops/formats/quant.h"
#include "ops/attention/rope.h"

namespace cedar::model {

void Compressor::project(int l, const Batch& b, const float* x) {
  const AttentionWeights& a = m_.w.blocks[l].attn;
  const size_t hd = m_.c.head_dim;
  float* ckv = scratch(kv_, b.T * hd);
  if (m_.plan.layers[l].compress_ratio > 1) {
    b.k.linear_bf16(x, b.T, a.comp_wkv, ckv, ops::LinearOut::kF32, b.pool);
    b.k.linear_bf16(x, b.T, a.comp_wgate, scratch(score_, b.T * hd), ops::LinearOut::kF32, b.pool);
  } else {
    b.k.linear_bf16(x, b.T, a.comp_wkv, ckv, ops::LinearOut::kBf16, b.pool);
  }
}

void Compressor::keep_in_state(const ChunkSpan& ch, int o, int slot, size_t row) {
  const size_t hd = m_.c.head_dim;
  std::memcpy(ch.seq->compressor_kv(o) + slot * hd, &kv_[row * hd], hd * sizeof(float));
  std::memcpy(ch.seq->compressor_score(o) + slot * hd, &score_[row * hd], hd * sizeof(float));
}

void Compressor::prefill(int l, const Batch& b, const ChunkSpan& ch, const KvEntryCodec& codec) {
  const int r = m_.plan.layers[l].compress_ratio;
  CEDAR_CHECK(ch.p0 == 0, "layer %d: a KV owner's prefill must start at position 0", l);
  const int o = ch.seq->owner_of_layer(l);
  const int64_t n_groups = static_cast<int64_t>(ch.n) / r;
  for (int64_t j = 0; j < n_groups; ++j) {
    for (int s = 0; r > 1 && s < r; ++s) keep_in_state(ch, o, s, ch.offset + j * r + s);
    emit(l, b, ch, ch.offset + j * r, j, codec);
  }
  // The trailing partial group waits in the state for decode.
  for (size_t s = 0; r > 1 && s < ch.n % r; ++s) keep_in_state(ch, o, static_cast<int>(s), ch.offset + n_groups * r + s);
}

void Compressor::decode(int l, const Batch& b, const ChunkSpan& ch, size_t row, int64_t i, const KvEntryCodec& codec) {
  const int r = m_.plan.layers[l].compress_ratio;
  // Replayed positions (bounded replay) keep the restored compressed KV; only the members of the
  // group still pending at replay_until (a resume inside a group) refill the compressor state.
  if (i < ch.seq->replay_until / r * r) return;
  if (r > 1) {
    const int o = ch.seq->owner_of_layer(l);
    const int s = static_cast<int>(i % r);
    if (ch.seq->journal) ch.seq->journal->before_compressor_write(o, i, s);
    keep_in_state(ch, o, s, row);
    if ((i + 1) % r == 0 && i >= ch.seq->replay_until) emit(l, b, ch, row, i / r, codec);
  } else if (i >= ch.seq->replay_until) {
    emit(l, b, ch, row, i, codec);
  }
}

// The compressed latent of one group (Compressor.forward), then the owner's index key and main
// entry, both at position group * ratio (Indexer.forward / Attention._compress_kv).
void Compressor::emit(int l, const Batch& b, const ChunkSpan& ch, size_t row, int64_t group, const KvEntryCodec& codec) {
  const int ratio = m_.plan.layers[l].compress_ratio;
  const AttentionWeights& a = m_.w.blocks[l].attn;
  const ops::RopeTable& rope = m_.rope(l);
  const size_t hd = m_.c.head_dim, ihd = m_.c.index_head_dim;
  const float eps = static_cast<float>(m_.c.norm_eps);
  const int o = ch.seq->owner_of_layer(l);
  float* latent = scratch(latent_, hd);
  if (ratio > 1) {
    // Per channel: softmax over the group's scores, weighted sum of its kv rows, in fp32 with the
    // group members added left to right; exp under the numerics contract (double, rounded once).
    const float* kvs = ch.seq->compressor_kv(o);    // [ratio, head_dim]
    const float* sc = ch.seq->compressor_score(o);  // [ratio, head_dim]
    for (size_t d = 0; d < hd; ++d) {
      float mx = sc[d];
      for (int r = 1; r < ratio; ++r) mx = std::max(mx, sc[r * hd + d]);
      float sum = 0;
      for (int r = 0; r < ratio; ++r) sum += ops::exp_f32(sc[r * hd + d] - mx);
      float acc = 0;
      for (int r = 0; r < ratio; ++r) acc += kvs[r * hd + d] * (ops::exp_f32(sc[r * hd + d] - mx) / sum);
      latent[d] = ops::round_bf16(acc);
    }
  } else {
    std::memcpy(latent, kv_.data() + row * hd, hd * sizeof(float));
  }
  ops::rms_norm(latent, 1, hd, a.comp_norm, eps, latent);  // [head_dim], pre-RoPE
  const int64_t pos = group * ratio;
  // Index key from the RoPE-free latent: k_norm(wk(latent)), RoPE, FP4 (E8M0, block 32).
  float* key = scratch(index_key_, ihd);
  b.k.linear_bf16(latent, 1, a.idx_wk, key, ops::LinearOut::kBf16, nullptr);
  ops::rms_norm(key, 1, ihd, a.idx_k_norm, eps, key);
  ops::apply_rope(rope, key, 1, 1, ihd, pos);
  uint8_t* ik = ch.seq->kv().index_key_mut(o, group);
  ops::fp4_quant_e8m0(key, ihd, ik, ik + ihd / 2);
  // Main entry: RoPE, FP4 (E4M3 scale per 16).
  ops::apply_rope(rope, latent, 1, 1, hd, pos);
  codec.store_main(latent, hd, ch.seq->kv().main_entry_mut(o, group));
  ch.seq->owner_entries[o] = group + 1;
  ch.seq->index_key_slot = l;  // shared_attn.index_k = self.k_cache
}

}  // namespace cedar::model
