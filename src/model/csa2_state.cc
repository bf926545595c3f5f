#include "model/csa2_state.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace cedar::model {

void Csa2State::begin_pass(const std::vector<ChunkSpan>& chunks, size_t T, const ModelConfig& c) {
  topk_layer = -1;
  ++pass_;  // dequantised index keys are re-validated once per pass (index_keys)
  candidate_width = 0;
  if (c.candidate_source_layer < 0) return;
  int64_t max_pos = 0;
  for (const ChunkSpan& ch : chunks) max_pos = std::max<int64_t>(max_pos, ch.p0 + static_cast<int64_t>(ch.n));
  candidate_width = static_cast<size_t>((max_pos + c.candidate_block_size - 1) / c.candidate_block_size);
  scratch(candidates, T * candidate_width);
}

void Csa2State::begin_topk(int l, size_t T, size_t index_topk) {
  if (topk_layer == l) return;
  topk_width = index_topk + 1;  // [count, entries...]
  scratch(topk, T * topk_width);
  topk_layer = l;
  for (size_t r = 0; r < T; ++r) topk[r * topk_width] = 0;
}

void Csa2State::move_row(size_t from, size_t to) {
  if (topk_width) std::memmove(&topk[to * topk_width], &topk[from * topk_width], topk_width * sizeof(int32_t));
  if (candidate_width) std::memmove(&candidates[to * candidate_width], &candidates[from * candidate_width], candidate_width);
}

// Dequantised index keys (with their spreads and key-major tiles) persist across forward passes, so a
// decode step decodes only the entries added since the last one. Entries can be rewritten between
// passes (bounded replay, a restored prefix) and a sequence state can be reused by another request,
// so the first use in a pass compares the cached rows' packed bytes with the sequence's and keeps
// only the rows before the first difference: a cached row is always the decoding of the bytes the
// sequence holds now. Within a pass entries are only appended, so the cache just grows.
const KeyCache& Csa2State::index_keys(const ChunkSpan& ch, int owner_layer, int64_t n_keys, size_t ihd) {
  const int o = ch.seq->owner_of_layer(owner_layer);
  const kv::Sequence& home = ch.seq->kv();
  const size_t entry_bytes = home.geometry().owners[o].index_entry_bytes;
  const int64_t per_block = home.geometry().owners[o].entries_per_block;
  // Entries [j0, j1) as runs that are contiguous in the KV home (one run per block).
  const auto for_runs = [&](int64_t j0, int64_t j1, auto&& fn) {
    for (int64_t j = j0; j < j1;) {
      const int64_t end = std::min(j1, (j / per_block + 1) * per_block);
      if (!fn(j, home.index_key(o, j), static_cast<size_t>(end - j))) return;
      j = end;
    }
  };
  KeyCache* kc = nullptr;
  for (auto& k : key_caches_)
    if (k.seq == ch.seq && k.owner == owner_layer) kc = &k;
  if (!kc) {
    // Take over a cache no sequence of this pass uses (its rows are re-validated below anyway).
    for (auto& k : key_caches_)
      if (k.pass != pass_ && (!kc || !k.seq)) kc = &k;
    if (!kc) kc = &key_caches_.emplace_back();
    kc->seq = ch.seq;
    kc->owner = owner_layer;
    if (kc->keys.head_dim() != ihd) kc->keys = ops::IndexKeyStore(ihd);
    kc->keys.truncate(0);
  }
  if (kc->pass != pass_) {
    kc->pass = pass_;
    // Rows past the owner's written entries may be rewritten: they are never kept.
    const int64_t held = std::min<int64_t>(static_cast<int64_t>(kc->keys.size()), ch.seq->owner_entries[o]);
    int64_t same = 0;
    for_runs(0, held, [&](int64_t j, const uint8_t* now, size_t n) {
      const uint8_t* was = kc->packed.data() + j * entry_bytes;
      if (std::memcmp(was, now, n * entry_bytes) == 0) {
        same += static_cast<int64_t>(n);
        return true;
      }
      while (std::memcmp(was, now, entry_bytes) == 0) {
        ++same;
        was += entry_bytes;
        now += entry_bytes;
      }
      return false;
    });
    kc->keys.truncate(static_cast<size_t>(same));
  }
  const size_t held = kc->keys.size();
  if (held < static_cast<size_t>(n_keys)) {
    CEDAR_CHECK(kc->keys.entry_bytes() == entry_bytes, "index entries of %zu bytes, the kernel reads %zu", entry_bytes,
                kc->keys.entry_bytes());
    scratch(kc->packed, static_cast<size_t>(n_keys) * entry_bytes);
    for_runs(static_cast<int64_t>(held), n_keys, [&](int64_t j, const uint8_t* src, size_t n) {
      std::memcpy(kc->packed.data() + j * entry_bytes, src, n * entry_bytes);
      kc->keys.append(src, n);
      return true;
    });
  }
  return *kc;
}

int reference_index_key_slot(const LayerPlan& plan, const ChunkSpan& ch, int l, int64_t i) {
  const auto& owners = plan.kv_owner_layers;
  // An owner publishes at decode position j when its group completes: (j + 1) % ratio == 0.
  auto publishes = [&](int owner, int64_t j) { return (j + 1) % plan.layers[owner].compress_ratio == 0; };
  for (auto it = owners.rbegin(); it != owners.rend(); ++it)
    if (*it <= l && publishes(*it, i)) return *it;
  for (int64_t j = i - 1; j >= ch.p0; --j)
    for (auto it = owners.rbegin(); it != owners.rend(); ++it)
      if (publishes(*it, j)) return *it;
  return ch.start_index_key_slot;
}

}  // namespace cedar::model
