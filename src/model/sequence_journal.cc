#include "model/sequence_journal.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/check.h"

namespace cedar::model {

SequenceJournal::SequenceJournal(const ModelConfig& c, const LayerPlan& plan, int max_positions, KvDtype dtype)
    : max_positions_(max_positions), window_(c.window_size), n_layers_(c.n_layers), head_dim_(c.head_dim),
      dtype_(dtype) {
  // Entry sizes as kv::CacheGeometry gives them for this dtype (kv/geometry.cc main_entry_bytes & co.).
  const bool bf16 = dtype == KvDtype::kBf16;
  window_bytes_ = static_cast<size_t>(bf16 ? c.head_dim * 2 : c.head_dim + c.head_dim / 32);
  main_bytes_ = static_cast<size_t>(bf16 ? c.head_dim * 2 : c.head_dim / 2 + c.head_dim / 16);
  index_bytes_ = static_cast<size_t>(c.index_head_dim / 2 + c.index_head_dim / 32);
  for (int l : plan.kv_owner_layers) {
    owner_layer_.push_back(l);
    owner_ratio_.push_back(plan.layers[l].compress_ratio);
  }
  const size_t owners = owner_layer_.size(), mp = static_cast<size_t>(std::max(max_positions, 0));
  window_saved_.resize(static_cast<size_t>(c.n_layers) * mp * window_bytes_);
  entries_before_.resize(owners);
  first_entry_.resize(owners);
  n_saved_entries_.resize(owners);
  // A pass of n positions completes at most n groups; the saved range [p0 / r, (p0 + n) / r] has at
  // most n + 1 entries (ratio 1).
  max_entries_ = mp + 1;
  main_saved_.resize(owners * max_entries_ * main_bytes_);
  index_saved_.resize(owners * max_entries_ * index_bytes_);
  // Each position writes one row per owner with a compressor (ratio > 1).
  const size_t compressing = static_cast<size_t>(std::count_if(owner_ratio_.begin(), owner_ratio_.end(),
                                                               [](int r) { return r > 1; }));
  row_undo_.resize(compressing * mp);
  row_saved_.resize(compressing * mp * 2 * static_cast<size_t>(c.head_dim));
}

Status SequenceJournal::begin(SequenceState& seq, int n) {
  if (seq_) return failed_precondition("sequence journal: already recording a pass (call rollback first)");
  if (seq.n_tokens <= 0) return invalid_argument("sequence journal: a verify pass must follow a prefill");
  if (n < 1 || n > max_positions_ || n > window_)
    return invalid_argument("sequence journal: a pass of " + std::to_string(n) + " positions (at most " +
                            std::to_string(std::min(max_positions_, window_)) + ")");
  if (seq.n_tokens + n > seq.capacity)
    return invalid_argument("sequence journal: the pass would exceed the sequence's capacity");
  if (!seq.valid() || seq.geometry().owners.size() != owner_layer_.size() || seq.kv_dtype != dtype_ ||
      seq.geometry().window_entry_bytes != window_bytes_ || seq.kv().n_tokens() != seq.n_tokens)
    return invalid_argument("sequence journal: the sequence was made for another model");
  seq_ = &seq;
  p0_ = seq.n_tokens;
  n_ = n;
  index_key_slot_ = seq.index_key_slot;
  tokens_size_ = static_cast<size_t>(seq.n_tokens);
  engram_size_ = seq.engram.compressed.size();
  n_row_undo_ = 0;
  const size_t wb = window_bytes_, mp = static_cast<size_t>(max_positions_);
  for (int l = 0; l < n_layers_; ++l)
    for (int t = 0; t < n; ++t) {
      const size_t slot = static_cast<size_t>((p0_ + t) % window_);
      std::memcpy(&window_saved_[(static_cast<size_t>(l) * mp + t) * wb], seq.window_ring(l) + slot * wb, wb);
    }
  // Entries that exist now (in the sequence's blocks); the pass's fresh blocks are released on rollback.
  const size_t mb = main_bytes_, ib = index_bytes_;
  const kv::Sequence& home = seq.kv();
  for (size_t o = 0; o < owner_layer_.size(); ++o) {
    const int oi = static_cast<int>(o);
    const int64_t r = owner_ratio_[o];
    const int64_t held_entries =
        static_cast<int64_t>(home.block_table().size()) * seq.geometry().owners[o].entries_per_block;
    entries_before_[o] = seq.owner_entries[o];
    first_entry_[o] = p0_ / r;
    const int64_t last = std::min((p0_ + n) / r, held_entries - 1);
    n_saved_entries_[o] = static_cast<int>(std::max<int64_t>(0, last - first_entry_[o] + 1));
    CEDAR_CHECK(static_cast<size_t>(n_saved_entries_[o]) <= max_entries_, "journal entry range");
    for (int e = 0; e < n_saved_entries_[o]; ++e) {
      std::memcpy(&main_saved_[(o * max_entries_ + e) * mb], home.main_entry(oi, first_entry_[o] + e), mb);
      if (ib) std::memcpy(&index_saved_[(o * max_entries_ + e) * ib], home.index_key(oi, first_entry_[o] + e), ib);
    }
  }
  seq.journal = this;
  return {};
}

void SequenceJournal::before_compressor_write(int owner_index, int64_t pos, int row) {
  CEDAR_CHECK(seq_ && n_row_undo_ < row_undo_.size(), "sequence journal: a compressor write outside a recorded pass");
  const size_t hd = static_cast<size_t>(head_dim_);
  float* saved = &row_saved_[n_row_undo_ * 2 * hd];
  std::memcpy(saved, seq_->compressor_kv(owner_index) + row * hd, hd * sizeof(float));
  std::memcpy(saved + hd, seq_->compressor_score(owner_index) + row * hd, hd * sizeof(float));
  row_undo_[n_row_undo_++] = {owner_index, row, pos};
}

void SequenceJournal::abandon(SequenceState& seq) {
  if (seq_ == &seq) seq_ = nullptr;
  if (seq.journal == this) seq.journal = nullptr;
  n_row_undo_ = 0;
}

Status SequenceJournal::rollback(SequenceState& seq, int keep) {
  if (seq_ != &seq) return failed_precondition("sequence journal: rollback of a sequence it did not record");
  if (keep < 0 || keep > n_) return invalid_argument("sequence journal: keep outside the recorded pass");
  if (seq.n_tokens != p0_ + n_) return failed_precondition("sequence journal: the recorded pass did not run whole");
  seq_ = nullptr;
  seq.journal = nullptr;
  const int64_t end = p0_ + keep;  // positions [end, p0 + n) are undone
  const size_t wb = window_bytes_, mp = static_cast<size_t>(max_positions_);
  for (int l = 0; l < n_layers_; ++l)
    for (int t = keep; t < n_; ++t) {
      const size_t slot = static_cast<size_t>((p0_ + t) % window_);
      std::memcpy(seq.window_ring(l) + slot * wb, &window_saved_[(static_cast<size_t>(l) * mp + t) * wb], wb);
    }
  // Compressor rows, newest write first: each restores what the write before it left.
  const size_t hd = static_cast<size_t>(head_dim_);
  for (size_t u = n_row_undo_; u-- > 0;) {
    const RowUndo& undo = row_undo_[u];
    if (undo.pos < end) continue;  // a kept position's write (the pass runs layer by layer)
    const float* saved = &row_saved_[u * 2 * hd];
    std::memcpy(seq.compressor_kv(undo.owner) + undo.row * hd, saved, hd * sizeof(float));
    std::memcpy(seq.compressor_score(undo.owner) + undo.row * hd, saved + hd, hd * sizeof(float));
  }
  n_row_undo_ = 0;
  // Compressed entries: the groups completed at kept positions stay (replayed positions complete
  // none: their entries were restored); later ones get their old bytes back.
  // The blocks past the kept positions go back to the pool first (the entries below are in kept ones).
  CEDAR_RETURN_IF_ERROR(seq.home().truncate(seq.kv(), end));
  const size_t mb = main_bytes_, ib = index_bytes_;
  kv::Sequence& home = seq.kv();
  for (size_t o = 0; o < owner_layer_.size(); ++o) {
    const int oi = static_cast<int>(o);
    const int64_t r = owner_ratio_[o];
    int64_t completed = 0;
    for (int64_t i = std::max(p0_, seq.replay_until); i < end; ++i) completed += (i + 1) % r == 0;
    seq.owner_entries[o] = entries_before_[o] + completed;
    const int64_t held_entries =
        static_cast<int64_t>(home.block_table().size()) * seq.geometry().owners[o].entries_per_block;
    for (int e = 0; e < n_saved_entries_[o]; ++e) {
      const int64_t entry = first_entry_[o] + e;
      if (entry < seq.owner_entries[o] || entry >= held_entries) continue;
      std::memcpy(home.main_entry_mut(oi, entry), &main_saved_[(o * max_entries_ + e) * mb], mb);
      if (ib) std::memcpy(home.index_key_mut(oi, entry), &index_saved_[(o * max_entries_ + e) * ib], ib);
    }
  }
  // The index-key slot as the last kept position's forward left it: the last owner (layer order)
  // publishing at the latest kept position where any owner publishes (reference_index_key_slot, csa2_state.h).
  seq.index_key_slot = index_key_slot_;
  for (int64_t q = end - 1, found = 0; q >= p0_ && !found; --q)
    for (size_t o = owner_layer_.size(); o-- > 0;)
      if ((q + 1) % owner_ratio_[o] == 0) {
        seq.index_key_slot = owner_layer_[o];
        found = 1;
        break;
      }
  if (seq.engram.compressed.size() > engram_size_)
    seq.engram.compressed.resize(std::min(seq.engram.compressed.size(), engram_size_ + static_cast<size_t>(keep)));
  seq.n_tokens = end;
  return {};
}

}  // namespace cedar::model
