#include "model/sequence_state.h"

#include <limits>

namespace cedar::model {

SequenceState make_sequence_state(const ModelConfig& c, const LayerPlan& plan, int64_t capacity) {
  SequenceState s;
  s.capacity = capacity;
  s.tokens.reserve(capacity);
  s.engram.compressed.reserve(capacity);
  const KvEntryFormat f{c.head_dim, c.index_head_dim};
  s.window.resize(c.n_layers);
  for (auto& w : s.window) w.assign(static_cast<size_t>(c.window_size) * f.window_bytes(), 0);
  s.owner_of_layer.assign(c.n_total_layers(), -1);
  for (int l : plan.kv_owner_layers) {
    KvOwnerState o;
    o.layer = l;
    o.ratio = plan.layers[l].compress_ratio;
    const int64_t entries = capacity / o.ratio + 1;
    o.main.assign(entries * f.main_bytes(), 0);
    o.index_keys.assign(entries * f.index_bytes(), 0);
    if (o.ratio > 1) {
      o.kv_state.assign(static_cast<size_t>(o.ratio) * c.head_dim, 0.0f);
      o.score_state.assign(static_cast<size_t>(o.ratio) * c.head_dim, -std::numeric_limits<float>::infinity());
    }
    s.owner_of_layer[l] = static_cast<int>(s.owners.size());
    s.owners.push_back(std::move(o));
  }
  return s;
}

}  // namespace cedar::model
