// SequenceJournal: what a speculative verify pass overwrites in a SequenceState, so that only the
// accepted prefix of the pass stays (docs/DSPARK.md "Verification and rollback").
//
// A verify pass is one decode chunk over positions [p0, p0 + n) (the last token and the drafts).
// begin() saves, before the pass, the bytes the pass can overwrite that are known by position: every
// layer's window slots p % window, each KV owner's compressed main and index entries the pass may
// complete, and the scalars (n_entries, index_key_slot). The compressor's pending rows (kv_state /
// score_state, row p % ratio) are written several times within one pass (ratio 2, six positions),
// so the forward pass itself hands each row's old contents to the journal just before it overwrites
// it (SequenceState::journal); rollback undoes those writes newest first.
//
// rollback(seq, k) keeps positions [p0, p0 + k) and restores everything else, so the state is the
// one a run that fed only those k tokens would have, byte for byte (tests/model/sequence_journal_test.cc).
// Every buffer is allocated by the constructor: a verify step allocates nothing.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "spec/config.h"
#include "spec/layer_plan.h"
#include "model/sequence_state.h"

namespace cedar::model {

class SequenceJournal {
 public:
  // For passes of at most `max_positions` positions over states made by Model::new_sequence with
  // entry format `dtype`.
  SequenceJournal(const ModelConfig& c, const LayerPlan& plan, int max_positions, KvDtype dtype = KvDtype::kReference);

  int max_positions() const { return max_positions_; }
  bool active() const { return seq_ != nullptr; }

  // Records what a decode chunk of `n` positions from seq.n_tokens will overwrite and attaches the
  // journal to `seq` (seq.journal) until rollback(). Errors: a prefill (n_tokens 0: the prefill path
  // writes the compressor state in bulk), n over max_positions or the window, a pass past the
  // state's capacity, a journal already attached.
  Status begin(SequenceState& seq, int n);

  // The forward pass, before position `pos` overwrites row `row` of owner `owner_index`'s compressor
  // state.
  void before_compressor_write(int owner_index, int64_t pos, int row);

  // Keeps the pass's first `keep` positions (0..n) and undoes the rest; detaches the journal.
  Status rollback(SequenceState& seq, int keep);
  // Detaches without restoring (the pass failed part way: the state is void anyway).
  void abandon(SequenceState& seq);

 private:
  struct RowUndo {
    int owner = 0, row = 0;
    int64_t pos = 0;
  };
  int max_positions_ = 0;
  int window_ = 0;
  int n_layers_ = 0, head_dim_ = 0;
  KvDtype dtype_ = KvDtype::kReference;
  size_t window_bytes_ = 0, main_bytes_ = 0, index_bytes_ = 0;
  std::vector<int> owner_ratio_;  // per owner index
  std::vector<int> owner_layer_;  // per owner index, for the index-key slot
  // Saved by begin().
  SequenceState* seq_ = nullptr;
  int64_t p0_ = 0;
  int n_ = 0;
  int index_key_slot_ = -1;
  size_t tokens_size_ = 0, engram_size_ = 0;
  std::vector<uint8_t> window_saved_;            // [n_layers][max_positions][window_bytes]
  std::vector<int64_t> entries_before_;          // per owner: n_entries
  std::vector<int64_t> first_entry_;             // per owner: the first entry saved
  std::vector<int> n_saved_entries_;             // per owner
  std::vector<uint8_t> main_saved_, index_saved_;  // [owners][max_entries][bytes]
  size_t max_entries_ = 0;
  // Compressor rows, in the order the pass wrote them: old kv and score rows [head_dim] each.
  std::vector<RowUndo> row_undo_;
  std::vector<float> row_saved_;                 // [capacity][2][head_dim]
  size_t n_row_undo_ = 0;
};

}  // namespace cedar::model
