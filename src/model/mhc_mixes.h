// The mixing half of a Block's hyper-connections for one sub-layer (Block.hc_pre in the reference):
// the mixes of every row's streams (the kernel set's hc_mixes), then each row's Sinkhorn split into
// its pre-mix, post weights and combination matrix. Shared by the backbone's blocks and the DSpark
// stages, which are Blocks too.
#pragma once

#include <cstddef>

#include "core/thread_pool.h"
#include "spec/config.h"
#include "ops/block/hc.h"
#include "ops/kernel_set.h"

namespace cedar::model {

// streams [n, hc, dim]; fn [mix, hc*dim], scale [3], base [mix] (mix = (2 + hc) * hc); mixes [n, mix]
// scratch; pre [n, hc], post [n, hc], comb [n, hc, hc] out.
inline void mhc_mixes(const ops::KernelSet& k, const ModelConfig& c, const float* streams, size_t n, const float* fn,
                      const float* scale, const float* base, float* mixes, float* pre, float* post, float* comb,
                      ThreadPool* pool) {
  const size_t hc = static_cast<size_t>(c.hc_mult), n_mix = (2 + hc) * hc;
  k.hc_mixes(streams, n, hc * static_cast<size_t>(c.dim), fn, n_mix, static_cast<float>(c.norm_eps), mixes, pool);
  for (size_t t = 0; t < n; ++t)
    ops::hc_split_sinkhorn(mixes + t * n_mix, scale, base, c.hc_mult, c.hc_sinkhorn_iters,
                           static_cast<float>(c.hc_eps), pre + t * hc, post + t * hc, comb + t * hc * hc);
}

}  // namespace cedar::model
