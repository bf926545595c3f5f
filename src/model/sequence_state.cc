#include "model/sequence_state.h"

#include <limits>

namespace cedar::model {

SequenceState make_sequence_state(const ModelConfig& c, const LayerPlan& plan, int64_t capacity, KvDtype dtype) {
  SequenceState s;
  s.capacity = capacity;
  s.kv_dtype = dtype;
  s.tokens.reserve(capacity);
  s.engram.compressed.reserve(capacity);
  const KvEntryFormat f{c.head_dim, c.index_head_dim, dtype};
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

uint64_t sequence_state_bytes(const ModelConfig& c, const LayerPlan& plan, int64_t capacity, KvDtype dtype) {
  const KvEntryFormat f{c.head_dim, c.index_head_dim, dtype};
  const uint64_t cap = static_cast<uint64_t>(capacity);
  uint64_t b = cap * sizeof(int32_t) * 2;  // tokens, Engram history
  b += static_cast<uint64_t>(c.n_layers) * static_cast<uint64_t>(c.window_size) * f.window_bytes();
  for (int l : plan.kv_owner_layers) {
    const int ratio = plan.layers[l].compress_ratio;
    b += (cap / static_cast<uint64_t>(ratio) + 1) * (f.main_bytes() + f.index_bytes());
    if (ratio > 1) b += 2ull * static_cast<uint64_t>(ratio) * static_cast<uint64_t>(c.head_dim) * sizeof(float);
  }
  return b;
}

uint64_t held_bytes(const SequenceState& s) {
  uint64_t b = s.tokens.capacity() * sizeof(int32_t) + s.engram.compressed.capacity() * sizeof(int32_t);
  for (const auto& w : s.window) b += w.capacity();
  for (const KvOwnerState& o : s.owners)
    b += o.main.capacity() + o.index_keys.capacity() + (o.kv_state.capacity() + o.score_state.capacity()) * sizeof(float);
  return b;
}

}  // namespace cedar::model
