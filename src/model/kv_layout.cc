#include "model/kv_layout.h"

#include <algorithm>

#include <xxhash.h>

#include "io/checkpoint.h"

namespace cedar::model {

kv::ModelKvSpec kv_spec_from_plan(const std::string& name, const ModelConfig& c, const LayerPlan& plan,
                                  uint64_t fingerprint) {
  kv::ModelKvSpec s;
  s.name = name;
  s.family = c.family == ModelFamily::kV41 ? kv::KvFamily::kV41 : kv::KvFamily::kV4;
  s.head_dim = c.head_dim;
  s.rope_head_dim = c.rope_head_dim;
  s.index_head_dim = c.index_head_dim;
  s.window_size = c.window_size;
  s.engram_history = c.engram_layer_ids.empty() ? 0 : c.engram_max_ngram_size - 1;
  s.model_fingerprint = fingerprint;
  for (const LayerPlanEntry& e : plan.layers) {
    kv::LayerKvSpec l;
    l.layer = e.layer;
    l.compress_ratio = e.compress_ratio;
    l.kv_from = e.kv_from;
    l.owns_compressed_kv = e.kv_from == e.layer;
    // V4.1 KV sources write the index keys their group's indexers score; V4 CSA layers own theirs.
    l.owns_index_keys = l.owns_compressed_kv && e.index_keys_from == e.layer;
    l.has_window = c.window_size > 0;
    s.layers.push_back(l);
  }
  return s;
}

uint64_t model_fingerprint(const std::string& config_text, const io::Checkpoint& ckpt) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, config_text.data(), config_text.size());
  for (const io::TensorView* t : ckpt.tensors()) {
    XXH3_64bits_update(st, t->name.data(), t->name.size());
    XXH3_64bits_update(st, t->shape.data(), t->shape.size() * sizeof(int64_t));
  }
  for (const char* name : {"embed.weight", "head.weight", "norm.weight", "layers.0.attn.wq_a.weight",
                           "layers.0.ffn.experts.0.w1.weight"}) {
    if (const io::TensorView* t = ckpt.find(name)) XXH3_64bits_update(st, t->data, std::min<size_t>(t->nbytes, 4096));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace cedar::model
