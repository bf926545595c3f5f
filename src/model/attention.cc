#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "model/model.h"
#include "ops/attention/attention.h"
#include "ops/block/norm.h"
#include "ops/attention/rope.h"

namespace cedar::model {
namespace {
constexpr size_t kDequantGrain = 8;  // KV entries per chunk when a pool dequantises them
}  // namespace

Attention::Attention(const ModelParts& m, KvDtype kv_dtype, IndexKeyMode index_keys)
    : m_(m), compressor_(m), indexer_(m), codec_(kv_entry_codec(kv_dtype)) {
  indexer_.set_key_mode(index_keys);
}

void Attention::forward(int l, const Batch& b, Csa2State& s, const float* x, float* out) {
  const ModelConfig& c = m_.c;
  const LayerPlanEntry& e = m_.plan.layers[l];
  const AttentionWeights& a = m_.w.blocks[l].attn;
  const ops::RopeTable& rope = m_.rope(l);
  const size_t T = b.T, H = c.n_heads, hd = c.head_dim, ql = c.q_lora_rank;
  const float eps = static_cast<float>(c.norm_eps);
  const size_t max_k = std::max({static_cast<size_t>(c.dim), ql, static_cast<size_t>(c.o_groups) * c.o_lora_rank});
  float* act = scratch(act_, b.k.act_scratch_floats(T, max_k));
  std::span<float> act_span(act, act_.size());
  const bool index_query = e.compress_ratio > 0 && (e.mode == AttnMode::kFull || e.mode == AttnMode::kReindex);

  // The FP8 projections that share an input run as one batch (one parallel region each):
  // wq_a and wkv of x, then wq_b and the indexer's wq_b of qr.
  // Query: qr = q_norm(wq_a(x)); q = wq_b(qr) with RoPE on the last rope_head_dim dims.
  // Window KV: kv_norm(wkv(x)), RoPE, FP8 QDQ of all head_dim dims (block 32).
  float* qr = scratch(qr_, T * ql);  // [T, q_lora]
  float* kv = scratch(kv_, T * hd);  // [T, head_dim]
  const ops::PreparedActivations xa = b.k.quantize_activations_fp8(x, T, a.wq_a.k, act_span);
  fp8_jobs_.clear();
  fp8_jobs_.push_back({ops::Fp8LinearJob::Kind::kGemm, xa, a.wq_a, qr});
  fp8_jobs_.push_back({ops::Fp8LinearJob::Kind::kGemm, xa, a.wkv, kv});
  ops::fp8_linear_batch(b.k, fp8_jobs_, b.pool);
  ops::rms_norm(qr, T, ql, a.q_norm, eps, qr);
  float* q = scratch(q_, T * H * hd);  // [T, H, head_dim]
  const ops::PreparedActivations qa = b.k.quantize_activations_fp8(qr, T, ql, act_span);
  fp8_jobs_.clear();
  fp8_jobs_.push_back({ops::Fp8LinearJob::Kind::kGemm, qa, a.wq_b, q});
  if (index_query) fp8_jobs_.push_back({ops::Fp8LinearJob::Kind::kGemm, qa, a.idx_wq_b, indexer_.query_rows(T)});
  ops::fp8_linear_batch(b.k, fp8_jobs_, b.pool);
  ops::rms_norm(kv, T, hd, a.kv_norm, eps, kv);
  for (const ChunkSpan& ch : b.chunks) {
    ops::apply_rope(rope, q + ch.offset * H * hd, ch.n, H, hd, ch.p0);
    ops::apply_rope(rope, kv + ch.offset * hd, ch.n, 1, hd, ch.p0);
  }
  codec_.round_window(kv, T * hd);  // the value the window entries hold
  if (e.compress_ratio > 0 && e.mode == AttnMode::kFull) compressor_.project(l, b, x);
  if (index_query) indexer_.prepare_queries(l, b, x);

  scratch(o_, T * H * hd);  // [T, H, head_dim]
  for (const ChunkSpan& ch : b.chunks) {
    if (ch.prefill) prefill(l, b, s, ch);
    else
      for (size_t t = 0; t < ch.n; ++t) decode(l, b, s, ch, t);
  }

  // Output: undo the query rotation, grouped low-rank wo_a (bf16 einsum on the FP8 weight
  // dequantised in registers), then wo_b.
  float* o = o_.data();
  for (const ChunkSpan& ch : b.chunks)
    ops::apply_rope(rope, o + ch.offset * H * hd, ch.n, H, hd, ch.p0, 1, ops::RopeDirection::kInverse);
  const size_t G = c.o_groups, K = H * hd / G, R = c.o_lora_rank;
  // All G groups in one batch. One token: group g reads o's slice g and writes wo_in's slice g in
  // place; more tokens: the slices are gathered to [G, T, K] and the outputs scattered from [G, T, R].
  const bool one_token = T == 1;
  float* og = scratch(o_grouped_, T * G * R + (one_token ? 0 : T * G * (K + R)));
  float* wo_in = og;                        // [T, G * o_lora]
  float* group_in = og + T * G * R;         // [G, T, K] (several tokens)
  float* group_out = group_in + T * G * K;  // [G, T, o_lora] (several tokens)
  fp8_jobs_.clear();
  for (size_t g = 0; g < G; ++g) {
    float* in = one_token ? o + g * K : group_in + g * T * K;
    if (!one_token)
      for (size_t t = 0; t < T; ++t) std::memcpy(in + t * K, o + t * H * hd + g * K, K * sizeof(float));
    // Group g's rows; R is a multiple of 32 (checked at load), so its scales start at a block row.
    const ops::Fp8Weight wg{a.wo_a.codes + g * R * K, a.wo_a.scales + (g * R / 32) * (K / 32), R, K};
    fp8_jobs_.push_back({ops::Fp8LinearJob::Kind::kAsBf16, ops::PreparedActivations::unquantized(in, T, K), wg,
                         one_token ? wo_in + g * R : group_out + g * T * R});
  }
  ops::fp8_linear_batch(b.k, fp8_jobs_, b.pool);
  if (!one_token)
    for (size_t g = 0; g < G; ++g)
      for (size_t t = 0; t < T; ++t) std::memcpy(wo_in + t * G * R + g * R, group_out + (g * T + t) * R, R * sizeof(float));
  b.k.linear_fp8(wo_in, T, a.wo_b, out, act_span, b.pool);
}

// The reference's start_pos 0 path (with decoder narrowing, the chunk's tail): the window operand is
// this chunk's own K; its last `win` positions seed the ring (position p in slot p % win).
void Attention::prefill(int l, const Batch& b, Csa2State& s, const ChunkSpan& ch) {
  const LayerPlanEntry& e = m_.plan.layers[l];
  const size_t hd = m_.c.head_dim, win = m_.c.window_size;
  const size_t slot_bytes = ch.seq->geometry().window_entry_bytes;
  const float* kv = kv_.data() + ch.offset * hd;
  uint8_t* ring = ch.seq->window_ring(l);
  for (size_t p = ch.n > win ? ch.n - win : 0; p < ch.n; ++p)
    codec_.store_window(kv + p * hd, hd, ring + ((ch.p0 + p) % win) * slot_bytes);
  if (e.compress_ratio > 0 && e.mode == AttnMode::kFull) compressor_.prefill(l, b, ch, codec_);
  if (e.compress_ratio > 0 && (e.mode == AttnMode::kFull || e.mode == AttnMode::kReindex)) indexer_.prefill(l, b, s, ch);
  // Row i sees rows max(0, i-win+1)..i, listed ascending and padded with -1 at the end
  // (get_window_topk_idxs with start_pos 0); positions below the window floor are -1 too.
  const size_t width = std::min(ch.n, win);
  const int64_t floor_row = ch.seq->window_floor - ch.p0;
  for_queries(b.pool, per_thread_, ch.n, [&](size_t i, QueryScratch& qs, ThreadPool* inner) {
    int32_t* widx = scratch(qs.window_idx, width);
    const size_t start = i + 1 > win ? i + 1 - win : 0;
    for (size_t j = 0; j < width; ++j) {
      const int64_t r = static_cast<int64_t>(start + j);
      widx[j] = (r > static_cast<int64_t>(i) || r < floor_row) ? -1 : static_cast<int32_t>(r);
    }
    attend(l, ch, s, ch.offset + i, kv, ch.n, widx, width, b.k, qs, inner);
  });
}

// The reference's decode path for token t of the chunk (position i).
void Attention::decode(int l, const Batch& b, Csa2State& s, const ChunkSpan& ch, size_t t) {
  const LayerPlanEntry& e = m_.plan.layers[l];
  const size_t hd = m_.c.head_dim, win = m_.c.window_size;
  const size_t slot_bytes = ch.seq->geometry().window_entry_bytes;
  const int64_t i = ch.p0 + static_cast<int64_t>(t);
  const size_t row = ch.offset + t;
  // The token enters the ring before attending (slot i % win).
  uint8_t* ring = ch.seq->window_ring(l);
  codec_.store_window(kv_.data() + row * hd, hd, ring + (i % win) * slot_bytes);
  if (e.compress_ratio > 0 && e.mode == AttnMode::kFull) compressor_.decode(l, b, ch, row, i, codec_);
  if (e.compress_ratio > 0 && (e.mode == AttnMode::kFull || e.mode == AttnMode::kReindex))
    indexer_.decode(l, b, s, ch, row, i);
  // The whole ring, oldest slot first; slots not yet written (slot > i) are -1, and so are slots
  // holding a position below the window floor (bounded replay truncates the window). Dequantised on
  // all threads when there is enough of it: on one, this loop is a serial gap of every layer in which
  // the other threads only wait.
  float* rows = scratch(window_rows_, win * hd);
  const size_t written = std::min<size_t>(win, static_cast<size_t>(i) + 1);
  parallel_if(b.pool, written * hd >= kMinParallelDequantFloats, written, kDequantGrain, [&](size_t s0, size_t s1, int) {
    for (size_t slot = s0; slot < s1; ++slot) codec_.load_window(ring + slot * slot_bytes, hd, rows + slot * hd);
  });
  if (per_thread_.empty()) per_thread_.resize(1);
  QueryScratch& qs = per_thread_[0];
  int32_t* widx = scratch(qs.window_idx, win);
  const size_t oldest = static_cast<size_t>(i % win) + 1;
  for (size_t j = 0; j < win; ++j) {
    const size_t slot = (oldest + j) % win;
    const int64_t held = i - static_cast<int64_t>((static_cast<size_t>(i) + win - slot) % win);  // its position
    widx[j] = (static_cast<int64_t>(slot) > i || held < ch.seq->window_floor) ? -1 : static_cast<int32_t>(slot);
  }
  attend(l, ch, s, row, rows, win, widx, win, b.k, qs, b.pool);
}

// sparse_attn over [window rows ; the compressed entries this query selected]. Only the selected
// compressed entries are dequantised (into a compact block); indices are remapped, order kept.
void Attention::attend(int l, const ChunkSpan& ch, const Csa2State& s, size_t row, const float* window_rows,
                       size_t n_window_rows, const int32_t* window_idx, size_t n_window_idx, const ops::KernelSet& k,
                       QueryScratch& qs, ThreadPool* inner) {
  const LayerPlanEntry& e = m_.plan.layers[l];
  const size_t H = m_.c.n_heads, hd = m_.c.head_dim;
  size_t n_comp = 0;
  const int32_t* comp = nullptr;
  if (e.compress_ratio > 0) {
    CEDAR_CHECK(s.topk_layer == e.topk_from, "layer %d: expected top-k of layer %d, have %d", l, e.topk_from,
                s.topk_layer);
    const int32_t* pub = s.topk.data() + row * s.topk_width;
    n_comp = static_cast<size_t>(pub[0]);
    comp = pub + 1;
  }
  int32_t* idx = scratch(qs.idx, n_window_idx + n_comp + m_.c.index_topk);
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
    parallel_if(inner, n_gathered * hd >= kMinParallelDequantFloats, n_gathered, kDequantGrain,
                [&](size_t g0, size_t g1, int) {
                  for (size_t g = g0; g < g1; ++g) codec_.load_main(home.main_entry(o, entry_of[g]), hd, gathered + g * hd);
                });
  }
  ops::KvRows kv{window_rows, n_window_rows, gathered, n_gathered};
  const float scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
  k.sparse_attn(q_.data() + row * H * hd, H, hd, kv, m_.w.blocks[l].attn.attn_sink, idx, n_window_idx + n_comp, scale,
                o_.data() + row * H * hd, inner);
}

}  // namespace cedar::model
