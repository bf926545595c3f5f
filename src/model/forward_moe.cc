// MoE (model.py Gate / Expert / MoE) and Engram (model.py Engram) for the forward pass.
#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/thread_pool.h"
#include "model/engram_module.h"
#include "model/forward_internal.h"
#include "ops/linear/linear.h"
#include "ops/formats/formats.h"
#include "ops/block/moe.h"

namespace cedar::model {

// Router: sqrt-softplus scores from fp32 logits, biased top-k selection, unbiased renormalised
// weights x route_scale. Experts run grouped by id (ascending) over the tokens that chose them, so
// every token accumulates its experts in ascending id order, then the shared expert, in fp32.
void ForwardPass::moe(int l, const float* x, float* out) {
  const LayerPlanEntry& e = plan_.layers[l];
  const BlockWeights& bw = w_.blocks[l];
  const size_t dim = c_.dim, inter = c_.moe_inter_dim, E = e.n_routed_experts, K = e.n_activated_experts;
  const float limit = static_cast<float>(c_.swiglu_limit);
  float* act = scratch(ws_.act_scratch, k_.act_scratch_floats(T_, std::max(dim, inter)));
  std::span<float> act_span(act, ws_.act_scratch.size());

  float* logits = scratch(ws_.logits, T_ * E);  // [T, E] fp32
  k_.linear_bf16(x, T_, bw.gate, logits, ops::LinearOut::kF32, pool_);
  int32_t* ids = scratch(ws_.expert_ids, T_ * K);  // [T, K]
  float* weights = scratch(ws_.expert_w, T_ * K);  // [T, K]
  // Gate.forward: image-span rows select with bias_vl (image_mask), text rows with bias.
  for (size_t t = 0; t < T_; ++t) {
    const float* bias = ws_.any_image && ws_.image_rows[t] && bw.gate_bias_vl ? bw.gate_bias_vl : bw.gate_bias;
    ops::route_sqrt_softplus(logits + t * E, bias, E, K, static_cast<float>(c_.route_scale), ids + t * K,
                             weights + t * K);
  }

  // Every selected expert's rows, grouped by expert id (ascending): expert j owns rows
  // [row0[j], row0[j] + rows[j]) of the [T*K, ...] buffers, token by token in order.
  const size_t R = T_ * K;
  int32_t* tokens = scratch(ws_.expert_tokens, R);  // row -> token
  int32_t* slots = scratch(ws_.expert_slot, R);     // row -> selection slot
  ws_.moe_experts.clear();
  ws_.moe_ids.clear();
  for (size_t ex = 0, row = 0; ex < E; ++ex) {
    const size_t first = row;
    for (size_t t = 0; t < T_; ++t)
      for (size_t k = 0; k < K; ++k)
        if (ids[t * K + k] == static_cast<int32_t>(ex)) {
          tokens[row] = static_cast<int32_t>(t);
          slots[row] = static_cast<int32_t>(k);
          ++row;
        }
    if (row > first) {
      ws_.moe_experts.push_back({static_cast<int32_t>(ex), first, row - first, 0});
      ws_.moe_ids.push_back(static_cast<int32_t>(ex));
    }
  }
  score_lookahead(l);
  float* row_w = scratch(ws_.expert_row_w, R);
  for (size_t i = 0; i < R; ++i) row_w[i] = weights[tokens[i] * K + slots[i]];
  // Expert parallelism: the rows of experts other ranks own leave first, so that they compute while
  // this rank runs the shared expert and its own experts.
  ExpertExchange* xch = m_.exchange_;
  const bool distributed = xch != nullptr && xch->n_ranks() > 1 && l < c_.n_layers;
  ws_.moe_local.clear();
  ws_.moe_local_ids.clear();
  for (size_t j = 0; j < ws_.moe_experts.size(); ++j)
    if (!distributed || xch->owner(l, ws_.moe_experts[j].expert) == xch->rank()) {
      ws_.moe_local.push_back(j);
      ws_.moe_local_ids.push_back(ws_.moe_experts[j].expert);
    }
  const bool posted = distributed && post_remote_experts(l, x, tokens, row_w);
  // The routed experts run in groups of at most max_held() (all of them when resident): each group's
  // weights are held while its GEMMs run, so every expert is fetched once per chunk, however many
  // tokens chose it. Router-first: the first group is announced now, so its reads are in flight while
  // the look-ahead router and the shared expert compute.
  WeightSource& src = *m_.source_;
  const size_t n_local = ws_.moe_local.size();
  const size_t group = std::max<size_t>(1, std::min(n_local, src.max_held()));
  src.will_need(l, {ws_.moe_local_ids.data(), std::min(group, n_local)});
  if (src.streaming() && m_.options_.residency.lookahead) lookahead(l, x);

  // An expert chosen by every token has x's rows as its own, in order: it reads x quantised once
  // (quantisation is per row, so the values are the same), and so does the shared expert then. In
  // decode that is every expert. (Decided over every chosen expert, local or not, so that the shared
  // expert takes the same path whatever the placement.)
  const bool x_shared = std::any_of(ws_.moe_experts.begin(), ws_.moe_experts.end(),
                                    [&](const auto& ae) { return ae.rows == T_; });
  ops::PreparedActivations xq;
  if (x_shared) {
    float* held = scratch(ws_.moe_shared_act, k_.act_scratch_floats(T_, dim));
    xq = k_.quantize_activations(x, T_, dim, {held, ws_.moe_shared_act.size()});
  }

  // Shared expert (FP8, same clamped SwiGLU, no routing weight), added last below.
  float* sg = scratch(ws_.shared_g, T_ * inter);
  float* su = scratch(ws_.shared_u, T_ * inter);
  float* sy = scratch(ws_.shared_out, T_ * dim);
  const ops::PreparedActivations xs = x_shared ? xq : k_.quantize_activations_fp8(x, T_, dim, act_span);
  ws_.fp8_jobs.clear();
  ws_.fp8_jobs.push_back({ops::Fp8LinearJob::Kind::kGemm, xs, bw.shared.w1, sg});
  ws_.fp8_jobs.push_back({ops::Fp8LinearJob::Kind::kGemm, xs, bw.shared.w3, su});
  ops::fp8_linear_batch(k_, ws_.fp8_jobs, pool_);
  for (size_t t = 0; t < T_; ++t) k_.swiglu_clamped(sg + t * inter, su + t * inter, inter, limit, 1.0f, sg + t * inter);
  k_.linear_fp8(sg, T_, bw.shared.w2, sy, act_span, pool_);

  float* ye = scratch(ws_.expert_out, R * dim);   // [R, dim]
  routed_experts(l, x, T_, tokens, row_w, x_shared ? &xq : nullptr, ye);
  if (posted) collect_remote_experts(ye);
  // Each token adds its experts' outputs in ascending expert id order (fp32), as the reference does.
  float* acc = scratch(ws_.moe_acc, T_ * dim);  // [T, dim] fp32
  std::memset(acc, 0, T_ * dim * sizeof(float));
  for (const auto& ae : ws_.moe_experts) {
    for (size_t i = ae.row0; i < ae.row0 + ae.rows; ++i) {
      float* dst = acc + tokens[i] * dim;
      const float* src_row = ye + i * dim;
      for (size_t d = 0; d < dim; ++d) dst[d] += src_row[d];
    }
  }
  for (size_t i = 0; i < T_ * dim; ++i) out[i] = ops::round_bf16(acc[i] + sy[i]);
}

void ForwardPass::routed_experts(int l, const float* x, size_t n_tokens, const int32_t* tokens, const float* row_w,
                                 const ops::PreparedActivations* xq, float* ye) {
  const size_t dim = c_.dim, inter = c_.moe_inter_dim;
  const float limit = static_cast<float>(c_.swiglu_limit);
  WeightSource& src = *m_.source_;
  const size_t n_local = ws_.moe_local.size();
  if (n_local == 0) return;
  const size_t group = std::max<size_t>(1, std::min(n_local, src.max_held()));
  size_t rows_total = 0;
  for (const auto& ae : ws_.moe_experts) rows_total = std::max(rows_total, ae.row0 + ae.rows);
  float* xe = scratch(ws_.expert_x, rows_total * dim);     // [R, dim]
  float* g = scratch(ws_.expert_g, rows_total * inter);    // [R, inter]
  float* u = scratch(ws_.expert_u, rows_total * inter);    // [R, inter]
  // Activation scratch per expert (each expert's rows are quantised on their own, as in the reference).
  size_t act_total = 0;
  for (size_t j : ws_.moe_local) {
    auto& ae = ws_.moe_experts[j];
    ae.act_offset = act_total;
    act_total += k_.act_scratch_floats(ae.rows, std::max(dim, inter));
  }
  float* moe_act = scratch(ws_.moe_act, act_total);
  ws_.moe_held.resize(group);
  for (size_t g0 = 0; g0 < n_local; g0 += group) {
    const size_t g1 = std::min(n_local, g0 + group);
    if (g0 > 0) src.will_need(l, {ws_.moe_local_ids.data() + g0, g1 - g0});
    for (size_t j = g0; j < g1; ++j) ws_.moe_held[j - g0] = src.get(l, ws_.moe_local_ids[j]);
    // w1 and w3 of every expert of the group in one parallel region, then w2 of every expert in another.
    ws_.fp4_jobs.clear();
    for (size_t j = g0; j < g1; ++j) {
      const auto& ae = ws_.moe_experts[ws_.moe_local[j]];
      const ExpertWeights& we = ws_.moe_held[j - g0];
      ops::PreparedActivations xa;
      if (xq != nullptr && ae.rows == n_tokens) {
        xa = *xq;
      } else {  // the expert's tokens' rows, gathered
        for (size_t i = ae.row0; i < ae.row0 + ae.rows; ++i)
          std::memcpy(xe + i * dim, x + tokens[i] * dim, dim * sizeof(float));
        xa = k_.quantize_activations(xe + ae.row0 * dim, ae.rows, dim,
                                     {moe_act + ae.act_offset, k_.act_scratch_floats(ae.rows, dim)});
      }
      ws_.fp4_jobs.push_back({xa, we.w1, g + ae.row0 * inter});
      ws_.fp4_jobs.push_back({xa, we.w3, u + ae.row0 * inter});
    }
    ops::gemm_fp4_batch(k_, ws_.fp4_jobs, pool_);
    // Each expert's SwiGLU and w2 input quantisation, experts in parallel (each writes its own rows
    // and activation scratch).
    ws_.fp4_jobs.resize(g1 - g0);
    const auto w2_inputs = [&](size_t j) {
      const auto& ae = ws_.moe_experts[ws_.moe_local[j]];
      for (size_t i = ae.row0; i < ae.row0 + ae.rows; ++i)
        k_.swiglu_clamped(g + i * inter, u + i * inter, inter, limit, row_w[i], g + i * inter);
      const ops::PreparedActivations ga = k_.quantize_activations(
          g + ae.row0 * inter, ae.rows, inter, {moe_act + ae.act_offset, k_.act_scratch_floats(ae.rows, inter)});
      ws_.fp4_jobs[j - g0] = {ga, ws_.moe_held[j - g0].w2, ye + ae.row0 * dim};
    };
    if (pool_ && pool_->size() > 1) {
      pool_->parallel_for(g1 - g0, 1, [&](size_t b, size_t e, int) {
        for (size_t j = g0 + b; j < g0 + e; ++j) w2_inputs(j);
      });
    } else {
      for (size_t j = g0; j < g1; ++j) w2_inputs(j);
    }
    ops::gemm_fp4_batch(k_, ws_.fp4_jobs, pool_);
    src.release_all();
  }
}

// Look-ahead: layer l+1's router applied to layer l's FFN input guesses the experts layer l+1 will
// choose (the residual stream changes little in one layer), so their reads start a layer early.
// Decode-sized batches only: a prefill chunk needs nearly every expert anyway.
void ForwardPass::lookahead(int l, const float* x) {
  ws_.lookahead_layer = -1;
  if (l + 1 >= c_.n_layers || T_ > kLookaheadMaxTokens) return;
  const LayerPlanEntry& e = plan_.layers[l + 1];
  const BlockWeights& bw = w_.blocks[l + 1];
  const size_t E = e.n_routed_experts, K = e.n_activated_experts;
  float* logits = scratch(ws_.lookahead_logits, T_ * E);
  k_.linear_bf16(x, T_, bw.gate, logits, ops::LinearOut::kF32, pool_);
  int32_t* ids = scratch(ws_.lookahead_ids, T_ * K);
  float* wts = scratch(ws_.lookahead_w, T_ * K);
  ws_.lookahead_pred.assign(E, 0);  // capacity kept: no allocation after the first step
  for (size_t t = 0; t < T_; ++t) {
    ops::route_sqrt_softplus(logits + t * E, bw.gate_bias, E, K, static_cast<float>(c_.route_scale), ids + t * K,
                             wts + t * K);
    for (size_t k = 0; k < K; ++k) ws_.lookahead_pred[ids[t * K + k]] = 1;
  }
  ws_.lookahead_list.clear();
  for (size_t ex = 0; ex < E; ++ex)
    if (ws_.lookahead_pred[ex]) ws_.lookahead_list.push_back(static_cast<int32_t>(ex));
  ws_.lookahead_layer = l + 1;
  m_.source_->hint(l + 1, ws_.lookahead_list);
}

// Precision of the previous layer's guess: guessed experts that this layer's router chose.
void ForwardPass::score_lookahead(int l) {
  if (ws_.lookahead_layer != l) return;
  size_t hit = 0;
  for (int32_t ex : ws_.moe_ids) hit += ws_.lookahead_pred[ex];
  m_.lookahead_predicted_ += ws_.lookahead_list.size();
  m_.lookahead_correct_ += hit;
  ws_.lookahead_layer = -1;
}

// Engram's token_mask: 0 at image-span rows (gate shut), empty for text only.
std::span<const uint8_t> ForwardPass::engram_mask() {
  if (!ws_.any_image) return {};
  uint8_t* part = scratch(ws_.engram_takes_part, T_);
  for (size_t t = 0; t < T_; ++t) part[t] = ws_.image_rows[t] ? 0 : 1;
  return {part, T_};
}

// Engram before block l: dequantised table rows of every column -> wkv -> gated residual update.
void ForwardPass::engram(int l) {
  const LayerPlanEntry& e = plan_.layers[l];
  const EngramWeights& ew = w_.blocks[l].engram;
  const NgramHasher& hasher = *m_.engram_hasher_;
  const size_t n_cols = hasher.n_columns(), hdim = c_.engram_head_dim, dim = c_.dim, hc = c_.hc_mult;
  const size_t per_token = static_cast<size_t>(hasher.n_layers()) * n_cols;
  int64_t* rows = scratch(ws_.engram_rows, T_ * per_token);
  int64_t* layer_rows = scratch(ws_.engram_layer_rows, T_ * n_cols);  // [T, n_cols]
  for (size_t t = 0; t < T_; ++t)
    std::memcpy(layer_rows + t * n_cols, rows + t * per_token + e.engram_index * n_cols, n_cols * sizeof(int64_t));
  const size_t n_rows = T_ * n_cols;
  for (size_t i = 0; i < n_rows; ++i)
    CEDAR_CHECK(layer_rows[i] >= 0 && layer_rows[i] < ew.rows,
                "engram layer %d: row id %lld is outside the embedding table (%lld rows); the checkpoint's "
                "engram.embed does not match config.json's engram_* fields",
                l, static_cast<long long>(layer_rows[i]), static_cast<long long>(ew.rows));
  // The rows' bytes, gathered (from the mapping or the row cache), then dequantised as a small table.
  uint8_t* codes = scratch(ws_.engram_codes, n_rows * hdim);
  uint8_t* scales = scratch(ws_.engram_scales, n_rows * hdim / 32);
  m_.source_->gather_rows(e.engram_index, {layer_rows, n_rows}, codes, scales);
  int64_t* local = scratch(ws_.engram_local, n_rows);
  for (size_t i = 0; i < n_rows; ++i) local[i] = static_cast<int64_t>(i);
  float* E = scratch(ws_.engram_e, n_rows * hdim);  // [T, n_cols * head_dim]
  // The engine's pool, as every other op of the pass (the process-wide one for callers without).
  ThreadPool& pool = pool_ ? *pool_ : ThreadPool::global();
  Status st = dequant_engram_rows({codes, n_rows * hdim}, {scales, n_rows * hdim / 32}, static_cast<int64_t>(n_rows),
                                  static_cast<int>(hdim), {local, n_rows}, {E, n_rows * hdim}, pool);
  CEDAR_CHECK(st.ok(), "engram layer %d: %s", l, st.message().c_str());
  float* kv = scratch(ws_.engram_kv, T_ * (hc + 1) * dim);  // [T, (hc+1)*dim]
  float* act = scratch(ws_.act_scratch, k_.act_scratch_floats(T_, n_cols * hdim));
  k_.linear_fp8(E, T_, ew.wkv, kv, {act, ws_.act_scratch.size()}, pool_);
  engram_gate_update({ws_.streams.data(), T_ * hc * dim}, {kv, T_ * (hc + 1) * dim}, {ew.q_weight, hc * dim},
                     {ew.k_weight, hc * dim}, {static_cast<int64_t>(T_), static_cast<int>(hc), static_cast<int>(dim)},
                     static_cast<float>(c_.norm_eps), engram_mask(), {}, pool, ws_.engram_gate);
}

}  // namespace cedar::model
