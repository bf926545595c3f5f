// Speculative decoding with the checkpoint's own DSpark draft head (docs/DSPARK.md "Verification"):
// the draft proposes up to dspark_block_size tokens, one backbone pass verifies the last token and
// the drafts together, and the sequence keeps exactly the accepted prefix (model::SequenceJournal
// undoes the rest). The ids are the model's own: greedy accepts a draft only when it is the argmax
// the backbone gives at that position; sampling uses speculative rejection sampling (accept with
// min(1, p/q), else resample from norm(max(0, p - q))), so the output distribution is the model's.
//
// The guard (DraftGuard) decides whether a pass pays: from the confidence head's score of each draft
// (calibrated online against what was accepted) and a byte cost model (DraftCostModel) it picks how
// many drafts to verify, and stops drafting, with exponential backoff, when verification would cost
// more than it saves.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/sequence_journal.h"
#include "ops/sample/sample.h"

namespace cedar::runtime {

class Sampler;

// --speculative: auto = on when the checkpoint has DSpark stages.
enum class SpeculativeMode { kOff, kOn, kAuto };
std::optional<SpeculativeMode> parse_speculative_mode(const std::string& s);  // "auto" | "on" | "off"
const char* speculative_mode_name(SpeculativeMode m);

// Bytes a decode pass reads, from the checkpoint's tensor inventory: dense weights once per pass
// (embedding rows and Engram rows are per token and small: not counted), the routed experts the
// pass's positions route to (the expected union under uniform routing), and the draft's own reads
// (its stages, the shared head over the block, the Markov head).
struct DraftCostModel {
  double dense_bytes = 0;             // backbone without routed experts
  double expert_bytes = 0;            // one routed expert of one layer
  int moe_layers = 0, n_experts = 0, top_k = 0;
  double draft_bytes = 0;             // one draft call (block_size rows)

  static DraftCostModel from_config(const model::ModelConfig& c);
  // Bytes of a backbone pass over `positions` tokens of one sequence.
  double pass_bytes(int positions) const;
  // Tokens per byte of a pass verifying `drafted` drafts with `expected_accepted` of them accepted,
  // relative to plain decode (> 1: the pass pays).
  double gain(int drafted, double expected_accepted) const;
};

// Draft length and backoff (issue 36 item 3).
class DraftGuard {
 public:
  static constexpr int kBins = 4;          // confidence bins: sigmoid(score) in quarters
  static constexpr int kMaxBackoff = 128;  // steps between probes when drafts do not pay
  // Prior acceptance of a draft position (peers report 2.8-3.5 of 5 accepted on real text: about 0.8
  // per position), weight 2: a fresh guard drafts, and a few rejections stop it.
  static constexpr double kPrior = 0.75, kPriorWeight = 2.0;

  explicit DraftGuard(const DraftCostModel& cost);
  // A new sequence's guard starts from what `engine` (the guard every pass is also recorded in) has
  // seen, at most `weight` observations of it, and in its backoff.
  void inherit(const DraftGuard& engine, double weight = 16.0);

  // Before drafting: false while backing off (counts the step).
  bool should_draft();
  // How many of the drafts (confidence scores in order) to verify: the k in [1, max] with the largest
  // expected gain. When none pays: 1 if this draft is a probe (the first after a backoff, so the
  // estimates can recover), else 0 (the caller decodes plainly and the guard backs off).
  int choose(std::span<const float> confidence, int max);
  // After a verify pass: `drafted` positions verified, the first `accepted` accepted.
  void record(std::span<const float> confidence, int drafted, int accepted);
  // The estimated probability that a draft with this confidence score is accepted (given the drafts
  // before it were): its bin's rate, shrunk towards the rate over all bins.
  double acceptance(float confidence) const;
  int backoff() const { return skip_; }

 private:
  static int bin(float confidence);
  void back_off();
  const DraftCostModel cost_;
  std::array<double, kBins> tried_{}, accepted_{};
  int skip_ = 0, next_skip_ = 2;
  bool probe_ = true;  // the next draft follows a backoff (or starts the sequence)
};

// Counters of one request (or the engine).
struct SpeculativeCounters {
  uint64_t passes = 0, drafted = 0, accepted = 0;
};

// Speculative sampling of one drafted position: target probabilities p and draft probabilities q over
// [0, n) (each summing to 1), the draft `token` (drawn from q). Accepts it with probability
// min(1, p/q); else returns a token drawn from norm(max(0, p - q)). Uses rng twice at most.
struct VerifyPick {
  bool accepted = false;
  int32_t token = 0;
};
VerifyPick speculative_pick(std::span<const double> p, std::span<const double> q, int32_t token, ops::SampleRng& rng);

// softmax(logits / T) over [0, n) in double (max-subtracted), into out.
void softmax_probs(const float* logits, size_t n, float temperature, std::vector<double>& out);

// One sequence's draft state and the engine-wide draft machinery. Every buffer is sized once: a
// speculative step allocates nothing in steady state.
class Speculator {
 public:
  // nullptr when the model has no draft head. Without the guard every step drafts and verifies a whole
  // block (tests, experiments).
  static std::unique_ptr<Speculator> create(model::Model& model, bool guard = true);

  struct Sequence {
    model::DraftState state;
    DraftGuard guard;
    ops::SampleRng rng;
    bool usable = true;  // observing failed (e.g. a resume whose replay does not cover the window)
    SpeculativeCounters counters;
  };
  std::unique_ptr<Sequence> new_sequence(uint64_t seed) const;

  // After every forward that ran the sequence as chunk `chunk`: its hook rows enter the draft state.
  void observe(Sequence& s, size_t chunk, ThreadPool* pool);

  // One step for a sequence whose next input is `last_token` and which may emit `max_new` more tokens.
  // Returns false when it did not run (the guard backs off, or the step could not draft): the caller
  // takes a plain step. Else `tokens` holds the emitted ids (accepted drafts, then the model's own,
  // cut after a stop id) and rows() their logits rows; the sequence state holds all but the last.
  Result<bool> step(Sequence& s, model::SequenceState& seq, int32_t last_token, Sampler& sampler,
                    float temperature, int max_new, std::vector<int32_t>* tokens, ThreadPool* pool);
  // The logits row (after the sampler's masking) of emitted token i of the last step.
  float* row(size_t i) { return rows_.data() + i * vocab_; }

  // Tests: rewrites greedy drafts before verification (position: that of the step's last token), so
  // that a test can make chosen drafts right and exercise every accepted length. Not for sampling
  // (the drafts would no longer come from the draft's distribution).
  using DraftFilter = std::function<void(int64_t position, std::span<int32_t> ids)>;
  void set_draft_filter(DraftFilter filter) { draft_filter_ = std::move(filter); }

 private:
  Speculator(model::Model& model, model::DraftHead& head, bool guard);
  Result<int32_t> accept(Sequence& s, float temperature, int k, Sampler& sampler);
  model::Model& model_;
  model::DraftHead& head_;
  const bool guard_;
  DraftCostModel cost_;
  model::SequenceJournal journal_;
  DraftGuard engine_guard_;  // every pass of every sequence: new sequences start from it
  model::DraftOutput draft_;
  size_t vocab_ = 0, sample_vocab_ = 0;
  std::vector<float> rows_;  // [block_size + 1, vocab]
  std::vector<int32_t> chunk_;
  std::vector<double> p_, q_;
  int accepted_ = 0;
  DraftFilter draft_filter_;
};

}  // namespace cedar::runtime
