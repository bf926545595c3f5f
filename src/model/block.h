// model.py Block: attention and the MoE FFN, each between the hyper-connection collapse (hc_pre:
// mixes, Sinkhorn split, pre-mix, RMSNorm) and expansion (hc_post). Single-pass mHC: attention
// consumes the pre-mix the previous FFN produced, the FFN the one this attention produced. One
// instance serves every layer; its scratch is reused.
#pragma once

#include <vector>

#include "model/attention.h"
#include "model/csa2_state.h"
#include "model/forward_batch.h"
#include "model/moe.h"

namespace cedar::model {

class Block {
 public:
  Block(const ModelParts& m, KvDtype kv_dtype, IndexKeyMode index_keys, bool lookahead)
      : m_(m), attn_(m, kv_dtype, index_keys), ffn_(m, lookahead) {}
  // streams [T, hc, dim] in/out; pre_mix [T, hc]: this block's attention pre-mix in, the next
  // block's out.
  void forward(int l, const Batch& b, Csa2State& s, std::vector<float>& streams, std::vector<float>& pre_mix);
  Attention& attn() { return attn_; }
  MoE& ffn() { return ffn_; }

 private:
  const ModelParts& m_;
  Attention attn_;
  MoE ffn_;
  std::vector<float> residual_, mixes_, attn_pre_, post_, comb_, x_, y_;
};

}  // namespace cedar::model
