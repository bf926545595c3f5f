// A model's sequences and their KV home: the one cache layout (kv_geometry), new sequence states,
// and the state a bounded-replay resume starts from.
#include <algorithm>

#include "core/check.h"
#include "model/kv_layout.h"
#include "model/model.h"
#include "model/transformer.h"

namespace cedar::model {

Result<kv::CacheGeometry> Model::kv_geometry(uint32_t block_tokens) const {
  kv::ModelKvSpec spec = kv_spec_from_plan(dir_, config_, plan_, fingerprint_);
  spec.bf16_entries = options_.kv_dtype == KvDtype::kBf16;
  return kv::make_cache_geometry(spec, block_tokens, config_.n_layers);
}

void Model::set_kv_dtype(KvDtype d) {
  options_.kv_dtype = d;
  if (transformer_) transformer_->set_kv_dtype(d);  // attention's entry codec
  auto g = kv_geometry(own_geometry_.block_tokens);
  CEDAR_CHECK(g.ok(), "set_kv_dtype: %s", g.status().to_string().c_str());
  own_geometry_ = std::move(*g);
}

Result<SequenceState> Model::new_sequence(int64_t capacity, kv::KvCache& home) const {
  const kv::CacheGeometry& g = home.geometry();
  if (g.model_fingerprint != fingerprint_ || g.window_entry_bytes != own_geometry_.window_entry_bytes ||
      g.block_bytes / g.block_tokens != own_geometry_.block_bytes / own_geometry_.block_tokens)
    return invalid_argument("new_sequence: the KV cache was made for another model or entry format");
  CEDAR_ASSIGN_OR_RETURN(SequenceState s, SequenceState::create(home, nullptr, capacity, options_.kv_dtype));
  home.reserve(s.kv(), capacity);
  return s;
}

SequenceState Model::new_sequence(int64_t capacity) const {
  kv::KvCacheOptions o;
  // Room for the state and three forks of it at full length (address space: pages are touched only
  // when a block is first written).
  o.capacity_blocks = 4 * kv::blocks_for_tokens(std::max<int64_t>(capacity, 1), own_geometry_.block_tokens) + 3;
  auto home = kv::KvCache::create(own_geometry_, o);
  CEDAR_CHECK(home.ok(), "new_sequence: %s", home.status().to_string().c_str());
  std::shared_ptr<kv::KvCache> shared(std::move(*home));
  auto s = SequenceState::create(*shared, shared, capacity, options_.kv_dtype);
  CEDAR_CHECK(s.ok(), "new_sequence: %s", s.status().to_string().c_str());
  shared->reserve(s->kv(), capacity);
  return std::move(*s);
}

Status Model::prepare_resume(SequenceState& seq, std::span<const int32_t> tokens, int64_t restored,
                             int64_t replay_from, const SequenceImages* images) const {
  if (restored < 0 || replay_from < 0 || replay_from > restored || static_cast<int64_t>(tokens.size()) < restored)
    return invalid_argument("resume: inconsistent positions");
  if (replay_from == 0) return invalid_argument("resume: a replay from position 0 is a cold prefill");
  // The Engram history of [0, replay_from): compressed ids only (the row ids are discarded).
  if (engram_hasher_) {
    const size_t per_token = static_cast<size_t>(engram_hasher_->n_layers()) * engram_hasher_->n_columns();
    std::vector<int64_t> rows(static_cast<size_t>(replay_from) * per_token);
    std::vector<uint8_t> takes_part;  // image positions take part in no n-gram (as in forward_round)
    if (images && !images->empty()) {
      takes_part.assign(static_cast<size_t>(replay_from), 1);
      for (const ImageSpan& s : images->spans)
        for (int64_t q = s.start; q < std::min(s.end(), replay_from); ++q) takes_part[q] = 0;
    }
    seq.engram.clear();
    CEDAR_RETURN_IF_ERROR(engram_hasher_->hash(seq.engram, 0, tokens.first(replay_from), takes_part, rows));
  }
  // The restored prefix's ids are the KV home's (attached or appended by the prefix cache): the
  // replayed positions are checked against them as they run.
  if (!seq.valid() || seq.n_tokens != 0 || seq.kv().n_tokens() < restored)
    return invalid_argument("resume: the sequence must be fresh with its restored prefix attached");
  std::vector<int32_t> keyed(tokens.begin(), tokens.begin() + restored);
  if (images) key_image_positions(*images, 0, keyed);
  for (int64_t p = 0; p < restored; ++p)
    if (seq.kv().tokens()[p] != keyed[p]) return invalid_argument("resume: the restored ids differ from the prompt");
  seq.n_tokens = replay_from;
  seq.replay_until = restored;
  seq.window_floor = replay_from;
  // The index-key slot as token restored - 1's forward left it (replayed positions publish no
  // keys): the last owner, in layer order, whose group completed at the latest position q < restored
  // where any group completed.
  seq.index_key_slot = -1;
  for (int64_t q = restored - 1; q >= 0 && seq.index_key_slot < 0; --q)
    for (auto it = plan_.kv_owner_layers.rbegin(); it != plan_.kv_owner_layers.rend(); ++it)
      if ((q + 1) % plan_.layers[*it].compress_ratio == 0) {
        seq.index_key_slot = *it;
        break;
      }
  const kv::CacheGeometry& g = seq.geometry();
  for (size_t o = 0; o < g.owners.size(); ++o) seq.owner_entries[o] = restored / g.owners[o].ratio;
  return {};
}

}  // namespace cedar::model
