#include "model/block.h"

#include <utility>

#include "model/mhc_mixes.h"
#include "ops/block/hc.h"
#include "ops/block/norm.h"

namespace cedar::model {

void Block::forward(int l, const Batch& b, Csa2State& s, std::vector<float>& streams, std::vector<float>& pre_mix) {
  const ModelConfig& c = m_.c;
  const BlockWeights& bw = m_.w.blocks[l];
  const size_t T = b.T, dim = c.dim, hc = c.hc_mult, hc_dim = hc * dim, n_mix = (2 + hc) * hc;
  const float eps = static_cast<float>(c.norm_eps);
  scratch(residual_, T * hc_dim);
  float* mixes = scratch(mixes_, T * n_mix);     // [T, 24]
  float* attn_pre = scratch(attn_pre_, T * hc);  // [T, hc]
  float* post = scratch(post_, T * hc);          // [T, hc]
  float* comb = scratch(comb_, T * hc * hc);     // [T, hc, hc]
  float* x = scratch(x_, T * dim);               // [T, dim]
  float* y = scratch(y_, T * dim);               // [T, dim]

  // Attention sub-layer. residual <- streams; the new streams are written into the other buffer.
  std::swap(streams, residual_);
  const float* R = residual_.data();  // [T, hc, dim]
  float* X = scratch(streams, T * hc_dim);
  mhc_mixes(b.k, c, R, T, bw.hc_attn_fn, bw.hc_attn_scale, bw.hc_attn_base, mixes, attn_pre, post, comb, b.pool);
  ops::hc_pre(R, pre_mix.data(), T, c.hc_mult, dim, x);
  ops::rms_norm(x, T, dim, bw.attn_norm, eps, x);
  attn_.forward(l, b, s, x, y);
  ops::hc_post(y, R, post, comb, T, c.hc_mult, dim, X);

  // FFN sub-layer; its pre-mix goes to the next block's attention.
  std::swap(streams, residual_);
  R = residual_.data();
  X = streams.data();
  mhc_mixes(b.k, c, R, T, bw.hc_ffn_fn, bw.hc_ffn_scale, bw.hc_ffn_base, mixes, pre_mix.data(), post, comb, b.pool);
  ops::hc_pre(R, attn_pre, T, c.hc_mult, dim, x);
  ops::rms_norm(x, T, dim, bw.ffn_norm, eps, x);
  ffn_.forward(l, b, x, y);
  ops::hc_post(y, R, post, comb, T, c.hc_mult, dim, X);
}

}  // namespace cedar::model
