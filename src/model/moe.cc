#include "model/moe.h"

#include <algorithm>
#include <cstring>

#include "ops/formats/formats.h"
#include "ops/block/moe.h"

namespace cedar::model {

void Gate::forward(int l, const Batch& b, const float* x, int32_t* ids, float* weights) {
  const BlockWeights& bw = m_.w.blocks[l];
  const size_t E = m_.plan.layers[l].n_routed_experts, K = m_.plan.layers[l].n_activated_experts;
  float* logits = scratch(logits_, b.T * E);  // [T, E] fp32
  b.k.linear_bf16(x, b.T, bw.gate, logits, ops::LinearOut::kF32, b.pool);
  for (size_t t = 0; t < b.T; ++t) {
    const float* bias = b.any_image && b.image_rows[t] && bw.gate_bias_vl ? bw.gate_bias_vl : bw.gate_bias;
    ops::route_sqrt_softplus(logits + t * E, bias, E, K, static_cast<float>(m_.c.route_scale), ids + t * K,
                             weights + t * K);
  }
}

void MoE::forward(int l, const Batch& b, const float* x, float* out) {
  const BlockWeights& bw = m_.w.blocks[l];
  const size_t T = b.T, dim = m_.c.dim, inter = m_.c.moe_inter_dim;
  const size_t E = m_.plan.layers[l].n_routed_experts, K = m_.plan.layers[l].n_activated_experts;
  const float limit = static_cast<float>(m_.c.swiglu_limit);
  float* act = scratch(act_, b.k.act_scratch_floats(T, std::max(dim, inter)));
  std::span<float> act_span(act, act_.size());
  int32_t* ids = scratch(rows_.chosen, T * K);
  float* weights = scratch(rows_.weights, T * K);
  gate_.forward(l, b, x, ids, weights);

  // Every selected expert's rows, grouped by expert id (ascending), token by token in order.
  const size_t R = T * K;
  int32_t* tokens = scratch(rows_.tokens, R);
  int32_t* slots = scratch(rows_.slots, R);
  rows_.experts.clear();
  rows_.ids.clear();
  for (size_t ex = 0, row = 0; ex < E; ++ex) {
    const size_t first = row;
    for (size_t t = 0; t < T; ++t)
      for (size_t k = 0; k < K; ++k)
        if (ids[t * K + k] == static_cast<int32_t>(ex)) {
          tokens[row] = static_cast<int32_t>(t);
          slots[row] = static_cast<int32_t>(k);
          ++row;
        }
    if (row > first) {
      rows_.experts.push_back({static_cast<int32_t>(ex), first, row - first, 0});
      rows_.ids.push_back(static_cast<int32_t>(ex));
    }
  }
  lookahead_.score(l, rows_.ids);
  float* row_w = scratch(rows_.row_w, R);
  for (size_t i = 0; i < R; ++i) row_w[i] = weights[tokens[i] * K + slots[i]];
  // Expert parallelism: the rows of experts other ranks own leave first, so that they compute while
  // this rank runs the shared expert and its own experts.
  local_.clear();
  local_ids_.clear();
  for (size_t j = 0; j < rows_.experts.size(); ++j)
    if (remote_.local(l, rows_.experts[j].expert)) {
      local_.push_back(j);
      local_ids_.push_back(rows_.experts[j].expert);
    }
  const bool posted = remote_.active() && remote_.post(l, x, T, dim, rows_);
  // The routed experts run in groups of at most max_held() (all of them when resident): each group's
  // weights are held while its GEMMs run, so every expert is fetched once per chunk, however many
  // tokens chose it. Router-first: the first group is announced now, so its reads are in flight while
  // the look-ahead router and the shared expert compute.
  const size_t group = std::max<size_t>(1, std::min(local_.size(), m_.source.max_held()));
  m_.source.will_need(l, {local_ids_.data(), std::min(group, local_.size())});
  lookahead_.predict(l, b, x);

  // An expert chosen by every token has x's rows as its own, in order: it reads x quantised once
  // (quantisation is per row, so the values are the same), and so does the shared expert then. In
  // decode that is every expert. (Decided over every chosen expert, local or not, so that the shared
  // expert takes the same path whatever the placement.)
  const bool x_shared = std::any_of(rows_.experts.begin(), rows_.experts.end(), [&](const auto& ae) { return ae.rows == T; });
  ops::PreparedActivations xq;
  if (x_shared) {
    float* held = scratch(shared_act_, b.k.act_scratch_floats(T, dim));
    xq = b.k.quantize_activations(x, T, dim, {held, shared_act_.size()});
  }

  // Shared expert (FP8, same clamped SwiGLU, no routing weight), added last below.
  float* sg = scratch(shared_g_, T * inter);
  float* su = scratch(shared_u_, T * inter);
  float* sy = scratch(shared_out_, T * dim);
  const ops::PreparedActivations xs = x_shared ? xq : b.k.quantize_activations_fp8(x, T, dim, act_span);
  fp8_jobs_.clear();
  fp8_jobs_.push_back({ops::Fp8LinearJob::Kind::kGemm, xs, bw.shared.w1, sg});
  fp8_jobs_.push_back({ops::Fp8LinearJob::Kind::kGemm, xs, bw.shared.w3, su});
  ops::fp8_linear_batch(b.k, fp8_jobs_, b.pool);
  for (size_t t = 0; t < T; ++t) b.k.swiglu_clamped(sg + t * inter, su + t * inter, inter, limit, 1.0f, sg + t * inter);
  b.k.linear_fp8(sg, T, bw.shared.w2, sy, act_span, b.pool);

  float* ye = scratch(ye_, R * dim);  // [R, dim]
  routed_experts(l, b.k, b.pool, x, T, tokens, row_w, x_shared ? &xq : nullptr, ye);
  if (posted) remote_.collect(rows_, dim, ye);
  // Each token adds its experts' outputs in ascending expert id order (fp32), as the reference does.
  float* acc = scratch(acc_, T * dim);  // [T, dim] fp32
  std::memset(acc, 0, T * dim * sizeof(float));
  for (const ActiveExpert& ae : rows_.experts)
    for (size_t i = ae.row0; i < ae.row0 + ae.rows; ++i) {
      float* dst = acc + tokens[i] * dim;
      const float* src_row = ye + i * dim;
      for (size_t d = 0; d < dim; ++d) dst[d] += src_row[d];
    }
  for (size_t i = 0; i < T * dim; ++i) out[i] = ops::round_bf16(acc[i] + sy[i]);
}

void MoE::routed_experts(int l, const ops::KernelSet& k, ThreadPool* pool, const float* x, size_t n_tokens,
                         const int32_t* tokens, const float* row_w, const ops::PreparedActivations* xq, float* ye) {
  const size_t dim = m_.c.dim, inter = m_.c.moe_inter_dim, n_local = local_.size();
  const float limit = static_cast<float>(m_.c.swiglu_limit);
  WeightSource& src = m_.source;
  if (n_local == 0) return;
  const size_t group = std::max<size_t>(1, std::min(n_local, src.max_held()));
  size_t rows_total = 0;
  for (const ActiveExpert& ae : rows_.experts) rows_total = std::max(rows_total, ae.row0 + ae.rows);
  float* xe = scratch(x_rows_, rows_total * dim);  // [R, dim]
  float* g = scratch(g_, rows_total * inter);      // [R, inter]
  float* u = scratch(u_, rows_total * inter);      // [R, inter]
  // Activation scratch per expert (each expert's rows are quantised on their own, as in the reference).
  size_t act_total = 0;
  for (size_t j : local_) {
    ActiveExpert& ae = rows_.experts[j];
    ae.act_offset = act_total;
    act_total += k.act_scratch_floats(ae.rows, std::max(dim, inter));
  }
  float* acts = scratch(expert_act_, act_total);
  held_.resize(group);
  for (size_t g0 = 0; g0 < n_local; g0 += group) {
    const size_t g1 = std::min(n_local, g0 + group);
    if (g0 > 0) src.will_need(l, {local_ids_.data() + g0, g1 - g0});
    for (size_t j = g0; j < g1; ++j) held_[j - g0] = src.get(l, local_ids_[j]);
    // w1 and w3 of every expert of the group in one parallel region, then w2 of every expert in another.
    fp4_jobs_.clear();
    for (size_t j = g0; j < g1; ++j) {
      const ActiveExpert& ae = rows_.experts[local_[j]];
      ops::PreparedActivations xa;
      if (xq != nullptr && ae.rows == n_tokens) {
        xa = *xq;
      } else {  // the expert's tokens' rows, gathered
        for (size_t i = ae.row0; i < ae.row0 + ae.rows; ++i)
          std::memcpy(xe + i * dim, x + tokens[i] * dim, dim * sizeof(float));
        xa = k.quantize_activations(xe + ae.row0 * dim, ae.rows, dim,
                                    {acts + ae.act_offset, k.act_scratch_floats(ae.rows, dim)});
      }
      fp4_jobs_.push_back({xa, held_[j - g0].w1, g + ae.row0 * inter});
      fp4_jobs_.push_back({xa, held_[j - g0].w3, u + ae.row0 * inter});
    }
    ops::gemm_fp4_batch(k, fp4_jobs_, pool);
    // Each expert's SwiGLU and w2 input quantisation, experts in parallel (each writes its own rows
    // and activation scratch).
    fp4_jobs_.resize(g1 - g0);
    parallel_if(pool, true, g1 - g0, 1, [&](size_t jb, size_t je, int) {
      for (size_t j = g0 + jb; j < g0 + je; ++j) {
        const ActiveExpert& ae = rows_.experts[local_[j]];
        for (size_t i = ae.row0; i < ae.row0 + ae.rows; ++i)
          k.swiglu_clamped(g + i * inter, u + i * inter, inter, limit, row_w[i], g + i * inter);
        const ops::PreparedActivations ga = k.quantize_activations(g + ae.row0 * inter, ae.rows, inter,
                                                              {acts + ae.act_offset, k.act_scratch_floats(ae.rows, inter)});
        fp4_jobs_[j - g0] = {ga, held_[j - g0].w2, ye + ae.row0 * dim};
      }
    });
    ops::gemm_fp4_batch(k, fp4_jobs_, pool);
    src.release_all();
  }
}

}  // namespace cedar::model
