// CSA2 attention (spec §4.4; model.py Attention / Compressor / Indexer / select_candidate_blocks):
// the query, the FP8 window ring, the compressor of KV owners, the indexer with the layer-20
// candidate pool, sparse attention over [window ; selected compressed entries] and the grouped
// output projection. Caches are stored packed in the sequence's KV home (sequence_state.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "model/forward_internal.h"
#include "model/sequence_journal.h"
#include "ops/attention/attention.h"
#include "ops/simd/exact_math.h"
#include "ops/formats/formats.h"
#include "ops/linear/linear.h"
#include "ops/block/norm.h"
#include "ops/formats/quant.h"
#include "ops/attention/rope.h"

namespace cedar::model {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
// KV entries per chunk when a pool dequantises them (kMinParallelDequantFloats: when it does).
constexpr size_t kDequantGrain = 8;

// Entry sizes of a sequence's KV home (its kv::CacheGeometry) and their format.
struct EntryFormat {
  size_t head_dim = 0, window_bytes = 0, main_bytes = 0, index_bytes = 0;
  bool is_bf16 = false;
  bool bf16() const { return is_bf16; }
};
EntryFormat entry_format(const SequenceState& s, size_t head_dim) {
  const kv::CacheGeometry& g = s.geometry();
  EntryFormat f;
  f.head_dim = head_dim;
  f.is_bf16 = s.kv_dtype == KvDtype::kBf16;
  f.window_bytes = g.window_entry_bytes;
  f.main_bytes = g.owners.empty() ? 0 : g.owners[0].main_entry_bytes;
  f.index_bytes = g.owners.empty() ? 0 : g.owners[0].index_entry_bytes;
  return f;
}

// Window entries: E4M3 + E8M0 (reference) or bf16 (the KvDtype::kBf16 experiment).
void store_window_entry(const EntryFormat& f, const float* x, uint8_t* slot) {
  if (f.bf16()) ops::f32_to_bf16_bytes(x, slot, f.head_dim);
  else ops::act_quant_fp8(x, f.head_dim, slot, slot + f.head_dim);
}
void load_window_entry(const EntryFormat& f, const uint8_t* slot, float* x) {
  if (f.bf16()) ops::bf16_bytes_to_f32(slot, x, f.head_dim);
  else ops::fp8_dequant_e8m0(slot, slot + f.head_dim, f.head_dim, x);
}
// Main (compressed) entries: E2M1 + E4M3 scales (reference) or bf16.
void store_main_entry(const EntryFormat& f, const float* x, uint8_t* entry) {
  if (f.bf16()) ops::f32_to_bf16_bytes(x, entry, f.head_dim);
  else ops::fp4_quant_e4m3(x, f.head_dim, entry, entry + f.head_dim / 2);
}
void load_main_entry(const EntryFormat& f, const uint8_t* entry, float* x) {
  if (f.bf16()) ops::bf16_bytes_to_f32(entry, x, f.head_dim);
  else ops::fp4_dequant_e4m3(entry, entry + f.head_dim / 2, f.head_dim, x);
}

}  // namespace

void ForwardPass::attention(int l, const float* x, float* out) {
  const LayerPlanEntry& e = plan_.layers[l];
  const AttentionWeights& a = w_.blocks[l].attn;
  const ops::RopeTable& rope = rope_for(l);
  const size_t H = c_.n_heads, hd = c_.head_dim, ql = c_.q_lora_rank;
  const float eps = static_cast<float>(c_.norm_eps);
  const size_t max_k = std::max({static_cast<size_t>(c_.dim), ql, static_cast<size_t>(c_.o_groups) * c_.o_lora_rank});
  float* act = scratch(ws_.act_scratch, k_.act_scratch_floats(T_, max_k));
  std::span<float> act_span(act, ws_.act_scratch.size());

  // The FP8 projections that share an input run as one batch (one parallel region each):
  // wq_a and wkv of x, then wq_b and the indexer's wq_b of qr.
  const bool index_query = e.compress_ratio > 0 && (e.mode == AttnMode::kFull || e.mode == AttnMode::kReindex);
  const size_t nih = c_.index_n_heads, ihd = c_.index_head_dim;
  // Query: qr = q_norm(wq_a(x)); q = wq_b(qr) with RoPE on the last rope_head_dim dims.
  // Window KV: kv_norm(wkv(x)), RoPE, FP8 QDQ of all head_dim dims (block 32).
  float* qr = scratch(ws_.qr, T_ * ql);      // [T, q_lora]
  float* kv = scratch(ws_.kv, T_ * hd);      // [T, head_dim]
  const ops::PreparedActivations xa = k_.quantize_activations_fp8(x, T_, a.wq_a.k, act_span);
  ws_.fp8_jobs.clear();
  ws_.fp8_jobs.push_back({ops::Fp8LinearJob::Kind::kGemm, xa, a.wq_a, qr});
  ws_.fp8_jobs.push_back({ops::Fp8LinearJob::Kind::kGemm, xa, a.wkv, kv});
  ops::fp8_linear_batch(k_, ws_.fp8_jobs, pool_);
  ops::rms_norm(qr, T_, ql, a.q_norm, eps, qr);
  float* q = scratch(ws_.q, T_ * H * hd);    // [T, H, head_dim]
  float* iq = index_query ? scratch(ws_.idx_q, T_ * nih * ihd) : nullptr;  // [T, index_heads, index_head_dim]
  const ops::PreparedActivations qa = k_.quantize_activations_fp8(qr, T_, ql, act_span);
  ws_.fp8_jobs.clear();
  ws_.fp8_jobs.push_back({ops::Fp8LinearJob::Kind::kGemm, qa, a.wq_b, q});
  if (index_query) ws_.fp8_jobs.push_back({ops::Fp8LinearJob::Kind::kGemm, qa, a.idx_wq_b, iq});
  ops::fp8_linear_batch(k_, ws_.fp8_jobs, pool_);
  ops::rms_norm(kv, T_, hd, a.kv_norm, eps, kv);
  for (const ChunkSpan& ch : chunks_) {
    ops::apply_rope(rope, q + ch.offset * H * hd, ch.n, H, hd, ch.p0);
    ops::apply_rope(rope, kv + ch.offset * hd, ch.n, 1, hd, ch.p0);
  }
  // (The bf16 KV experiment rounds to bf16 instead: the value its window entries hold.)
  if (m_.options().kv_dtype == KvDtype::kBf16) ops::round_bf16_inplace({kv, T_ * hd});
  else ops::act_qdq_fp8_inplace(kv, T_ * hd);

  if (e.compress_ratio > 0) {
    // Compressor inputs of a KV owner: ratio 2 runs in fp32 (weights promoted), ratio 1 in bf16.
    if (e.mode == AttnMode::kFull) {
      float* ckv = scratch(ws_.c_kv, T_ * hd);  // [T, head_dim]
      if (e.compress_ratio > 1) {
        k_.linear_bf16(x, T_, a.comp_wkv, ckv, ops::LinearOut::kF32, pool_);
        k_.linear_bf16(x, T_, a.comp_wgate, scratch(ws_.c_score, T_ * hd), ops::LinearOut::kF32, pool_);
      } else {
        k_.linear_bf16(x, T_, a.comp_wkv, ckv, ops::LinearOut::kBf16, pool_);
      }
    }
    // Indexer query: FP4-QDQ'd wq_b(qr) (computed above, with q) with RoPE, and the per-head weights.
    if (index_query) {
      for (const ChunkSpan& ch : chunks_) ops::apply_rope(rope, iq + ch.offset * nih * ihd, ch.n, nih, ihd, ch.p0);
      ops::fp4_qdq_e8m0_inplace(iq, T_ * nih * ihd);
      float* iw = scratch(ws_.idx_w, T_ * nih);        // [T, index_heads]
      k_.linear_bf16(x, T_, a.idx_weights_proj, iw, ops::LinearOut::kBf16, pool_);
      const float scale = static_cast<float>(std::pow(static_cast<double>(ihd), -0.5) *
                                             std::pow(static_cast<double>(nih), -0.5));
      for (size_t i = 0; i < T_ * nih; ++i) iw[i] = ops::round_bf16(iw[i] * scale);
    }
  }

  float* o = scratch(ws_.o, T_ * H * hd);  // [T, H, head_dim]
  for (const ChunkSpan& ch : chunks_) attention_chunk(l, ch);

  // Output: undo the query rotation, grouped low-rank wo_a (bf16 einsum on the
  // FP8 weight dequantised in registers), then wo_b.
  for (const ChunkSpan& ch : chunks_)
    ops::apply_rope(rope, o + ch.offset * H * hd, ch.n, H, hd, ch.p0, 1, ops::RopeDirection::kInverse);
  const size_t G = c_.o_groups, K = H * hd / G, R = c_.o_lora_rank;
  // All G groups in one batch. One token: group g reads o's slice g and writes wo_in's slice g in
  // place; more tokens: the slices are gathered to [G, T, K] and the outputs scattered from [G, T, R].
  const bool one_token = T_ == 1;
  float* og = scratch(ws_.o_grouped, T_ * G * R + (one_token ? 0 : T_ * G * (K + R)));
  float* wo_in = og;                         // [T, G * o_lora]
  float* group_in = og + T_ * G * R;         // [G, T, K] (several tokens)
  float* group_out = group_in + T_ * G * K;  // [G, T, o_lora] (several tokens)
  ws_.fp8_jobs.clear();
  for (size_t g = 0; g < G; ++g) {
    float* in = one_token ? o + g * K : group_in + g * T_ * K;
    if (!one_token)
      for (size_t t = 0; t < T_; ++t) std::memcpy(in + t * K, o + t * H * hd + g * K, K * sizeof(float));
    // Group g's rows; R is a multiple of 32 (checked at load), so its scales start at a block row.
    const ops::Fp8Weight wg{a.wo_a.codes + g * R * K, a.wo_a.scales + (g * R / 32) * (K / 32), R, K};
    ws_.fp8_jobs.push_back({ops::Fp8LinearJob::Kind::kAsBf16, ops::PreparedActivations::unquantized(in, T_, K), wg,
                            one_token ? wo_in + g * R : group_out + g * T_ * R});
  }
  ops::fp8_linear_batch(k_, ws_.fp8_jobs, pool_);
  if (!one_token)
    for (size_t g = 0; g < G; ++g)
      for (size_t t = 0; t < T_; ++t)
        std::memcpy(wo_in + t * G * R + g * R, group_out + (g * T_ + t) * R, R * sizeof(float));
  k_.linear_fp8(wo_in, T_, a.wo_b, out, act_span, pool_);
}

void ForwardPass::attention_chunk(int l, const ChunkSpan& ch) {
  const size_t hd = c_.head_dim, win = c_.window_size;
  const EntryFormat fmt = entry_format(*ch.seq, c_.head_dim);
  if (!ch.prefill) {
    for (size_t t = 0; t < ch.n; ++t) decode_token(l, ch, t);
    return;
  }
  // Prefill (the reference's start_pos 0 path; with decoder narrowing, the chunk's tail): the window
  // operand is this chunk's own K; its last `win` positions seed the ring (position p in slot p % win).
  const float* kv = ws_.kv.data() + ch.offset * hd;
  uint8_t* ring = ch.seq->window_ring(l);
  for (size_t p = ch.n > win ? ch.n - win : 0; p < ch.n; ++p) {
    store_window_entry(fmt, kv + p * hd, ring + ((ch.p0 + p) % win) * fmt.window_bytes);
  }
  if (plan_.layers[l].compress_ratio > 0) compress_and_index_prefill(l, ch);
  // Row i sees rows max(0, i-win+1)..i, listed ascending and padded with -1 at the end
  // (get_window_topk_idxs with start_pos 0); positions below the window floor are -1 too.
  const size_t width = std::min(ch.n, win);
  const int64_t floor_row = ch.seq->window_floor - ch.p0;
  for_queries(ch.n, [&](size_t i, Workspace::QueryScratch& qs, ThreadPool* inner) {
    int32_t* widx = scratch(qs.window_idx, width);
    const size_t start = i + 1 > win ? i + 1 - win : 0;
    for (size_t j = 0; j < width; ++j) {
      const int64_t r = static_cast<int64_t>(start + j);
      widx[j] = (r > static_cast<int64_t>(i) || r < floor_row) ? -1 : static_cast<int32_t>(r);
    }
    attend(l, ch, ch.offset + i, kv, ch.n, widx, width, qs, inner);
  });
}

// Queries of a prefill chunk are independent once the layer's shared state (published top-k rows,
// dequantised index keys) is prepared: they run in parallel, each thread with its own scratch, and
// the ops inside a query run inline. One query alone keeps the pool for its ops.
template <typename Fn>
void ForwardPass::for_queries(size_t n, Fn&& fn) {
  const size_t threads = pool_ ? static_cast<size_t>(pool_->size()) : 1;
  if (ws_.query_scratch.size() < threads) ws_.query_scratch.resize(threads);
  if (n == 1 || threads == 1) {
    for (size_t i = 0; i < n; ++i) fn(i, ws_.query_scratch[0], pool_);
    return;
  }
  pool_->parallel_for(n, 1, [&](size_t b, size_t e, int t) {
    for (size_t i = b; i < e; ++i) fn(i, ws_.query_scratch[static_cast<size_t>(t)], nullptr);
  });
}

// The compressed latent of one group (Compressor.forward), then the owner's index key and main
// entry, both at position group * ratio (Indexer.forward / Attention._compress_kv).
void ForwardPass::produce_latent(int l, const ChunkSpan& ch, size_t row, int64_t group, float* latent) {
  const LayerPlanEntry& e = plan_.layers[l];
  const AttentionWeights& a = w_.blocks[l].attn;
  const ops::RopeTable& rope = rope_for(l);
  const size_t hd = c_.head_dim, ihd = c_.index_head_dim;
  const float eps = static_cast<float>(c_.norm_eps);
  const EntryFormat fmt = entry_format(*ch.seq, c_.head_dim);
  const int o = ch.seq->owner_of_layer(l);
  if (e.compress_ratio > 1) {
    // Per channel: softmax over the group's scores, weighted sum of its kv rows, in fp32 with the
    // group members added left to right; exp under the numerics contract (double, rounded once).
    const float* kvs = ch.seq->compressor_kv(o);    // [ratio, head_dim]
    const float* sc = ch.seq->compressor_score(o);  // [ratio, head_dim]
    for (size_t d = 0; d < hd; ++d) {
      float mx = sc[d];
      for (int r = 1; r < e.compress_ratio; ++r) mx = std::max(mx, sc[r * hd + d]);
      float sum = 0;
      for (int r = 0; r < e.compress_ratio; ++r) sum += ops::exp_f32(sc[r * hd + d] - mx);
      float acc = 0;
      for (int r = 0; r < e.compress_ratio; ++r) acc += kvs[r * hd + d] * (ops::exp_f32(sc[r * hd + d] - mx) / sum);
      latent[d] = ops::round_bf16(acc);
    }
  } else {
    std::memcpy(latent, ws_.c_kv.data() + row * hd, hd * sizeof(float));
  }
  ops::rms_norm(latent, 1, hd, a.comp_norm, eps, latent);  // [head_dim], pre-RoPE
  const int64_t pos = group * e.compress_ratio;
  // Index key from the RoPE-free latent: k_norm(wk(latent)), RoPE, FP4 (E8M0, block 32).
  float* key = scratch(ws_.index_key, ihd);  // [index_head_dim]
  k_.linear_bf16(latent, 1, a.idx_wk, key, ops::LinearOut::kBf16, nullptr);
  ops::rms_norm(key, 1, ihd, a.idx_k_norm, eps, key);
  ops::apply_rope(rope, key, 1, 1, ihd, pos);
  uint8_t* ik = ch.seq->kv().index_key_mut(o, group);
  ops::fp4_quant_e8m0(key, ihd, ik, ik + ihd / 2);
  // Main entry: RoPE, FP4 (E4M3 scale per 16).
  ops::apply_rope(rope, latent, 1, 1, hd, pos);
  store_main_entry(fmt, latent, ch.seq->kv().main_entry_mut(o, group));
  ch.seq->owner_entries[o] = group + 1;
  ch.seq->index_key_slot = l;  // shared_attn.index_k = self.k_cache
}

void ForwardPass::compress_and_index_prefill(int l, const ChunkSpan& ch) {
  const LayerPlanEntry& e = plan_.layers[l];
  const int r = e.compress_ratio;
  const size_t hd = c_.head_dim;
  const int64_t n_groups = static_cast<int64_t>(ch.n) / r;
  if (e.mode == AttnMode::kFull) {
    CEDAR_CHECK(ch.p0 == 0, "layer %d: a KV owner's prefill must start at position 0", l);
    const int o = ch.seq->owner_of_layer(l);
    float* state_kv = r > 1 ? ch.seq->compressor_kv(o) : nullptr;       // [ratio, head_dim]
    float* state_score = r > 1 ? ch.seq->compressor_score(o) : nullptr; // [ratio, head_dim]
    float* latent = scratch(ws_.gathered_rows, hd);
    for (int64_t j = 0; j < n_groups; ++j) {
      if (r > 1)
        for (int s = 0; s < r; ++s) {
          std::memcpy(&state_kv[s * hd], &ws_.c_kv[(ch.offset + j * r + s) * hd], hd * sizeof(float));
          std::memcpy(&state_score[s * hd], &ws_.c_score[(ch.offset + j * r + s) * hd], hd * sizeof(float));
        }
      produce_latent(l, ch, ch.offset + j * r, j, latent);
    }
    // The trailing partial group waits in the state for decode.
    for (size_t s = 0; r > 1 && s < ch.n % r; ++s) {
      std::memcpy(&state_kv[s * hd], &ws_.c_kv[(ch.offset + n_groups * r + s) * hd], hd * sizeof(float));
      std::memcpy(&state_score[s * hd], &ws_.c_score[(ch.offset + n_groups * r + s) * hd], hd * sizeof(float));
    }
  }
  if (e.mode != AttnMode::kFull && e.mode != AttnMode::kReindex) return;
  const int64_t n_keys = (ch.p0 + static_cast<int64_t>(ch.n)) / r;  // end_pos // ratio
  begin_indexer_layer(l);
  if (n_keys > 0) prepare_index_keys(l, ch, ch.p0, n_keys);
  for_queries(ch.n, [&](size_t i, Workspace::QueryScratch& qs, ThreadPool* inner) {
    const int64_t pos = ch.p0 + static_cast<int64_t>(i);
    run_indexer(l, ch, ch.offset + i, pos, n_keys, (pos + 1) / r, static_cast<int32_t>(ch.n), qs, inner);
  });
}

void ForwardPass::decode_token(int l, const ChunkSpan& ch, size_t t) {
  const LayerPlanEntry& e = plan_.layers[l];
  const size_t hd = c_.head_dim, win = c_.window_size;
  const EntryFormat fmt = entry_format(*ch.seq, c_.head_dim);
  const int64_t i = ch.p0 + static_cast<int64_t>(t);
  const size_t row = ch.offset + t;
  // The token enters the ring before attending (slot i % win).
  uint8_t* ring = ch.seq->window_ring(l);
  store_window_entry(fmt, ws_.kv.data() + row * hd, ring + (i % win) * fmt.window_bytes);

  if (e.compress_ratio > 0) {
    const int r = e.compress_ratio;
    // Replayed positions (bounded replay) keep the restored compressed KV; only the members of the
    // group still pending at replay_until (a resume inside a group) refill the compressor state.
    const int64_t pending_from = ch.seq->replay_until / r * r;
    if (e.mode == AttnMode::kFull && i >= pending_from) {
      const int o = ch.seq->owner_of_layer(l);
      float* latent = scratch(ws_.gathered_rows, hd);
      if (r > 1) {
        const int s = static_cast<int>(i % r);
        if (ch.seq->journal) ch.seq->journal->before_compressor_write(o, i, s);
        std::memcpy(ch.seq->compressor_kv(o) + s * hd, &ws_.c_kv[row * hd], hd * sizeof(float));
        std::memcpy(ch.seq->compressor_score(o) + s * hd, &ws_.c_score[row * hd], hd * sizeof(float));
        if ((i + 1) % r == 0 && i >= ch.seq->replay_until) produce_latent(l, ch, row, i / r, latent);
      } else if (i >= ch.seq->replay_until) {
        produce_latent(l, ch, row, i, latent);
      }
    }
    const int64_t n_keys = (i + 1) / r;
    if (e.mode == AttnMode::kFull || e.mode == AttnMode::kReindex) {
      if (ws_.query_scratch.empty()) ws_.query_scratch.resize(1);
      begin_indexer_layer(l);
      if (n_keys > 0) prepare_index_keys(l, ch, i, n_keys);
      run_indexer(l, ch, row, i, n_keys, n_keys, static_cast<int32_t>(win), ws_.query_scratch[0], pool_);
    }
  }
  // The whole ring, oldest slot first; slots not yet written (slot > i) are -1, and so are slots
  // holding a position below the window floor (bounded replay truncates the window).
  // Dequantised on all threads when there is enough of it: on one, this loop is a serial gap of every
  // layer in which the other threads only wait. Slots not yet written are skipped (their index below
  // is -1).
  const float* rows = scratch(ws_.window_rows, win * hd);
  const size_t written = std::min<size_t>(win, static_cast<size_t>(i) + 1);
  const auto load_slots = [&](size_t s0, size_t s1, int) {
    for (size_t s = s0; s < s1; ++s) load_window_entry(fmt, ring + s * fmt.window_bytes, ws_.window_rows.data() + s * hd);
  };
  if (pool_ && written * hd >= kMinParallelDequantFloats) pool_->parallel_for(written, kDequantGrain, load_slots);
  else load_slots(0, written, 0);
  if (ws_.query_scratch.empty()) ws_.query_scratch.resize(1);
  Workspace::QueryScratch& qs = ws_.query_scratch[0];
  int32_t* widx = scratch(qs.window_idx, win);
  const size_t oldest = static_cast<size_t>(i % win) + 1;
  for (size_t j = 0; j < win; ++j) {
    const size_t s = (oldest + j) % win;
    const int64_t held = i - static_cast<int64_t>((static_cast<size_t>(i) + win - s) % win);  // position in slot s
    widx[j] = (static_cast<int64_t>(s) > i || held < ch.seq->window_floor) ? -1 : static_cast<int32_t>(s);
  }
  attend(l, ch, row, rows, win, widx, win, qs, pool_);
}

// Dequantised index keys (with their spreads and key-major tiles) persist across forward passes, so a
// decode step decodes only the entries added since the last one. Entries can be rewritten between
// passes (bounded replay, a restored prefix) and a sequence state can be reused by another request,
// so the first use in a pass compares the cached rows' packed bytes with the sequence's and keeps
// only the rows before the first difference: a cached row is always the decoding of the bytes the
// sequence holds now. Within a pass entries are only appended, so the cache just grows.
const Workspace::KeyCache& ForwardPass::dequantized_index_keys(const ChunkSpan& ch, int owner_layer,
                                                               int64_t n_keys) {
  const size_t ihd = c_.index_head_dim;
  const int o = ch.seq->owner_of_layer(owner_layer);
  const kv::Sequence& home = ch.seq->kv();
  const size_t entry_bytes = home.geometry().owners[o].index_entry_bytes;
  const int64_t per_block = home.geometry().owners[o].entries_per_block;
  // Entries [j0, j1) as runs that are contiguous in the KV home (one run per block).
  const auto for_runs = [&](int64_t j0, int64_t j1, auto&& fn) {
    for (int64_t j = j0; j < j1;) {
      const int64_t end = std::min(j1, (j / per_block + 1) * per_block);
      if (!fn(j, home.index_key(o, j), static_cast<size_t>(end - j))) return;
      j = end;
    }
  };
  Workspace::KeyCache* kc = nullptr;
  for (auto& k : ws_.key_caches)
    if (k.seq == ch.seq && k.owner == owner_layer) kc = &k;
  if (!kc) {
    // Take over a cache no sequence of this pass uses (its rows are re-validated below anyway).
    for (auto& k : ws_.key_caches)
      if (k.pass != ws_.pass && (!kc || !k.seq)) kc = &k;
    if (!kc) kc = &ws_.key_caches.emplace_back();
    kc->seq = ch.seq;
    kc->owner = owner_layer;
    if (kc->keys.head_dim() != ihd) kc->keys = ops::IndexKeyStore(ihd);
    kc->keys.truncate(0);
  }
  if (kc->pass != ws_.pass) {
    kc->pass = ws_.pass;
    // Rows past the owner's written entries may be rewritten: they are never kept.
    const int64_t held = std::min<int64_t>(static_cast<int64_t>(kc->keys.size()), ch.seq->owner_entries[o]);
    int64_t same = 0;
    for_runs(0, held, [&](int64_t j, const uint8_t* now, size_t n) {
      const uint8_t* was = kc->packed.data() + j * entry_bytes;
      if (std::memcmp(was, now, n * entry_bytes) == 0) {
        same += static_cast<int64_t>(n);
        return true;
      }
      while (std::memcmp(was, now, entry_bytes) == 0) {
        ++same;
        was += entry_bytes;
        now += entry_bytes;
      }
      return false;
    });
    kc->keys.truncate(static_cast<size_t>(same));
  }
  const size_t held = kc->keys.size();
  if (held < static_cast<size_t>(n_keys)) {
    CEDAR_CHECK(kc->keys.entry_bytes() == entry_bytes, "index entries of %zu bytes, the kernel reads %zu", entry_bytes,
                kc->keys.entry_bytes());
    scratch(kc->packed, static_cast<size_t>(n_keys) * entry_bytes);
    for_runs(static_cast<int64_t>(held), n_keys, [&](int64_t j, const uint8_t* src, size_t n) {
      std::memcpy(kc->packed.data() + j * entry_bytes, src, n * entry_bytes);
      kc->keys.append(src, n);
      return true;
    });
  }
  return *kc;
}

// Indexer.forward for one query: bf16 scores against the published index keys, causal mask,
// candidate pool (build or consume), top-k re-sorted ascending, unreachable -> -1, rest + offset.
void ForwardPass::begin_indexer_layer(int l) {
  if (ws_.published_topk_layer == l) return;
  // First query of this layer in this forward: size the published lists for all T rows.
  const size_t topk_width = c_.index_topk;
  scratch(ws_.published_topk, T_ * (topk_width + 1));
  ws_.published_topk_width = topk_width + 1;  // [count, entries...]
  ws_.published_topk_layer = l;
  for (size_t r = 0; r < T_; ++r) ws_.published_topk[r * ws_.published_topk_width] = 0;
}

// Which owner's index keys a query scores: the last published (reference) or the layer's own source.
int ForwardPass::index_keys_layer(int l, const ChunkSpan& ch, int64_t query_pos) const {
  if (m_.options_.index_keys == IndexKeyMode::kReference)
    return ch.prefill ? ch.seq->index_key_slot : reference_slot(ch, l, query_pos);
  return plan_.layers[l].index_keys_from;
}

const Workspace::KeyCache& ForwardPass::prepare_index_keys(int l, const ChunkSpan& ch, int64_t query_pos,
                                                           int64_t n_keys) {
  const int keys_layer = index_keys_layer(l, ch, query_pos);
  CEDAR_CHECK(keys_layer >= 0, "layer %d: no index keys were published before its indexer ran", l);
  const int64_t entries = ch.seq->owner_entries[ch.seq->owner_of_layer(keys_layer)];
  CEDAR_CHECK(entries >= n_keys, "layer %d: index-key source %d holds %lld entries, %lld needed", l, keys_layer,
              static_cast<long long>(entries), static_cast<long long>(n_keys));
  return dequantized_index_keys(ch, keys_layer, n_keys);
}

void ForwardPass::run_indexer(int l, const ChunkSpan& ch, size_t row, int64_t query_pos, int64_t n_keys,
                              int64_t visible, int32_t offset, Workspace::QueryScratch& qs, ThreadPool* inner) {
  const LayerPlanEntry& e = plan_.layers[l];
  const size_t nih = c_.index_n_heads, ihd = c_.index_head_dim;
  const size_t topk_width = c_.index_topk;
  CEDAR_CHECK(ws_.published_topk_layer == l, "layer %d: begin_indexer_layer was not called", l);
  int32_t* pub = ws_.published_topk.data() + row * ws_.published_topk_width;
  if (n_keys == 0) {
    pub[0] = 0;
    return;
  }
  const Workspace::KeyCache& kc = prepare_index_keys(l, ch, query_pos, n_keys);
  float* scores = scratch(qs.scores, n_keys);  // [n_keys]
  // Only the entries this query can see are scored (a prefill query sees a causal prefix of the
  // chunk's keys); the rest are masked as the reference's causal mask does.
  const int64_t n_scored = std::clamp<int64_t>(visible, 0, n_keys);
  const float* q = ws_.idx_q.data() + row * nih * ihd;
  const float* w = ws_.idx_w.data() + row * nih;
  const size_t cand_width = static_cast<size_t>(n_keys);
  if (e.candidate == CandidateRole::kConsumer) {
    consumer_topk(row, q, w, kc, n_keys, n_scored, visible, offset, pub, qs, inner);
    return;
  }
  const size_t scored = static_cast<size_t>(n_scored);
  kc.keys.scores(q, w, nih, scored, scores, inner);
  // scores[scored, n_keys) stay unwritten: those entries are -inf, which the code below accounts for.

  if (e.candidate == CandidateRole::kBuildsPool) {
    // select_candidate_blocks: block score = max of its entries, the block holding the newest visible
    // entry pinned to +inf, keep the best candidate_topk_blocks blocks that are reachable (> -inf).
    const size_t bs = c_.candidate_block_size;
    const size_t nb = (cand_width + bs - 1) / bs;
    float* bscore = scratch(qs.block_scores, nb);
    for (size_t b = 0; b < nb; ++b) {
      float mx = kNegInf;
      for (size_t t = b * bs; t < std::min(scored, (b + 1) * bs); ++t) mx = std::max(mx, scores[t]);
      bscore[b] = mx;
    }
    if (visible >= 1) bscore[(visible - 1) / bs] = kPosInf;
    const size_t kb = std::min<size_t>(c_.candidate_topk_blocks, nb);
    int32_t* chosen = scratch(qs.topk_out, std::max<size_t>(kb, topk_width));
    int32_t* tscratch = scratch(qs.topk_scratch, std::max<size_t>(nb, cand_width));
    ops::topk_ascending(bscore, nb, kb, chosen, tscratch);
    CEDAR_CHECK(nb <= ws_.candidate_width, "candidate pool of %zu blocks exceeds the sized %zu", nb, ws_.candidate_width);
    uint8_t* cand = ws_.candidates.data() + row * ws_.candidate_width;  // one flag per block
    std::memset(cand, 0, nb);
    for (size_t j = 0; j < kb; ++j)
      if (bscore[chosen[j]] > kNegInf) cand[chosen[j]] = 1;
  }
  const size_t k = std::min<size_t>(topk_width, n_keys);
  int32_t* out = pub + 1;
  // Entries past the visible prefix are -inf and have the highest indices, so whenever the prefix
  // holds k entries the top-k over it is the top-k over all (ties among -inf go to lower indices).
  // A shorter prefix is picked whole, with the lowest -inf entries after it: indices [0, k).
  if (scored >= k) {
    ops::topk_ascending(scores, scored, k, out, scratch(qs.topk_scratch, std::max<size_t>(scored, 1)));
  } else {
    for (size_t j = 0; j < k; ++j) out[j] = static_cast<int32_t>(j);
  }
  for (size_t j = 0; j < k; ++j) out[j] = out[j] < visible ? out[j] + offset : -1;
  pub[0] = static_cast<int32_t>(k);
}

// A consumer of the candidate pool: the reference masks every key outside the pool's blocks to
// -inf and takes the top-k over all keys. Only pool keys can then rank above -inf, so only the
// tiles holding them are scored, and the top-k runs over the pool's keys. When fewer than k of them
// are above -inf, the rest of the k are -inf entries, which tie and go to the lowest indices: the
// lowest keys outside that set (as topk_ascending would pick them from the full masked row).
void ForwardPass::consumer_topk(size_t row, const float* q, const float* w, const Workspace::KeyCache& kc,
                                int64_t n_keys, int64_t n_scored, int64_t visible, int32_t offset, int32_t* pub,
                                Workspace::QueryScratch& qs, ThreadPool* inner) {
  const size_t nih = c_.index_n_heads;
  const size_t bs = c_.candidate_block_size, tile = ops::kIndexKeyTile;
  const size_t n = static_cast<size_t>(n_keys), scored = static_cast<size_t>(n_scored);
  const uint8_t* cand = ws_.candidates.data() + row * ws_.candidate_width;
  const size_t nb = (n + bs - 1) / bs;
  CEDAR_CHECK(nb <= ws_.candidate_width, "candidate pool of %zu blocks exceeds the sized %zu", nb, ws_.candidate_width);
  uint8_t* mask = scratch(qs.tile_mask, (n + tile - 1) / tile);
  std::memset(mask, 0, (n + tile - 1) / tile);
  for (size_t b = 0; b < nb; ++b) {
    if (!cand[b]) continue;
    const size_t t0 = b * bs, t1 = std::min(scored, (b + 1) * bs);
    for (size_t t = t0; t < t1; t += tile) mask[t / tile] = 1;
    if (t0 < t1) mask[(t1 - 1) / tile] = 1;
  }
  float* scores = scratch(qs.scores, n);
  kc.keys.scores(q, w, nih, scored, scores, inner, mask);
  // The pool's visible keys in ascending order, with their scores.
  int32_t* ck = scratch(qs.cand_keys, n);
  float* cs = scratch(qs.cand_scores, n);
  size_t m = 0, above = 0;  // pool keys; of those, above -inf (NaN ranks highest)
  for (size_t b = 0; b < nb; ++b) {
    if (!cand[b]) continue;
    for (size_t t = b * bs; t < std::min(scored, (b + 1) * bs); ++t) {
      ck[m] = static_cast<int32_t>(t);
      cs[m] = scores[t];
      above += !(scores[t] == kNegInf);
      ++m;
    }
  }
  const size_t k = std::min<size_t>(c_.index_topk, n);
  int32_t* out = pub + 1;
  int32_t* local = scratch(qs.topk_out, std::max<size_t>(k, 1));
  size_t picked = 0;
  if (above >= k) {
    ops::topk_ascending(cs, m, k, local, scratch(qs.topk_scratch, std::max<size_t>(m, 1)));
    for (size_t j = 0; j < k; ++j) out[j] = ck[local[j]];
    picked = k;
  } else {
    // Every key above -inf, then the lowest keys whose score is -inf, merged in ascending order.
    size_t remaining_above = above;
    size_t a = 0;  // walks the pool keys
    for (size_t t = 0; t < n && picked < k; ++t) {
      while (a < m && static_cast<size_t>(ck[a]) < t) ++a;
      const bool is_above = a < m && static_cast<size_t>(ck[a]) == t && !(cs[a] == kNegInf);
      if (is_above) {
        out[picked++] = static_cast<int32_t>(t);
        --remaining_above;
      } else if (picked + remaining_above < k) {
        out[picked++] = static_cast<int32_t>(t);  // a -inf entry, and there is room beside the rest
      }
    }
  }
  for (size_t j = 0; j < picked; ++j) out[j] = out[j] < visible ? out[j] + offset : -1;
  pub[0] = static_cast<int32_t>(picked);
}

// sparse_attn over [window rows ; the compressed entries this query selected]. Only the selected
// compressed entries are dequantised (into a compact block); indices are remapped, order kept.
void ForwardPass::attend(int l, const ChunkSpan& ch, size_t row, const float* window_rows, size_t n_window_rows,
                         const int32_t* window_idx, size_t n_window_idx, Workspace::QueryScratch& qs,
                         ThreadPool* inner) {
  const LayerPlanEntry& e = plan_.layers[l];
  const size_t H = c_.n_heads, hd = c_.head_dim;
  const EntryFormat fmt = entry_format(*ch.seq, c_.head_dim);
  size_t n_comp = 0;
  const int32_t* comp = nullptr;
  if (e.compress_ratio > 0) {
    CEDAR_CHECK(ws_.published_topk_layer == e.topk_from, "layer %d: expected top-k of layer %d, have %d", l,
                e.topk_from, ws_.published_topk_layer);
    const int32_t* pub = ws_.published_topk.data() + row * ws_.published_topk_width;
    n_comp = static_cast<size_t>(pub[0]);
    comp = pub + 1;
  }
  int32_t* idx = scratch(qs.idx, n_window_idx + n_comp + c_.index_topk);
  std::memcpy(idx, window_idx, n_window_idx * sizeof(int32_t));
  float* gathered = scratch(qs.gathered, std::max<size_t>(n_comp, 1) * hd);
  size_t n_gathered = 0;
  if (n_comp) {
    const int o = ch.seq->owner_of_layer(e.kv_from);
    const int64_t n_entries = ch.seq->owner_entries[o];
    const kv::Sequence& home = ch.seq->kv();
    // First the compact order (which selected entry lands in which gathered row), then the
    // dequantisation, on all threads where the caller has them (a decode step; a prefill runs its
    // queries in parallel instead and passes no pool).
    int32_t* entry_of = scratch(qs.gather_entry, n_comp);
    for (size_t j = 0; j < n_comp; ++j) {
      if (comp[j] < 0) {
        idx[n_window_idx + j] = -1;
        continue;
      }
      const int64_t entry = comp[j] - static_cast<int64_t>(n_window_rows);
      CEDAR_CHECK(entry >= 0 && entry < n_entries, "layer %d: compressed index %lld out of range", l,
                  static_cast<long long>(entry));
      entry_of[n_gathered] = static_cast<int32_t>(entry);
      idx[n_window_idx + j] = static_cast<int32_t>(n_window_rows + n_gathered);
      ++n_gathered;
    }
    const auto load_entries = [&](size_t g0, size_t g1, int) {
      for (size_t g = g0; g < g1; ++g)
        load_main_entry(fmt, home.main_entry(o, entry_of[g]), gathered + g * hd);
    };
    if (inner && n_gathered * hd >= kMinParallelDequantFloats) inner->parallel_for(n_gathered, kDequantGrain, load_entries);
    else load_entries(0, n_gathered, 0);
  }
  ops::KvRows kv{window_rows, n_window_rows, gathered, n_gathered};
  const float scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
  k_.sparse_attn(ws_.q.data() + row * H * hd, H, hd, kv, w_.blocks[l].attn.attn_sink, idx, n_window_idx + n_comp,
                 scale, ws_.o.data() + row * H * hd, inner);
}

}  // namespace cedar::model
