#include "runtime/speculative.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/log.h"
#include "spec/weight_inventory.h"
#include "runtime/sampler.h"

namespace cedar::runtime {

std::optional<SpeculativeMode> parse_speculative_mode(const std::string& s) {
  if (s == "auto") return SpeculativeMode::kAuto;
  if (s == "on") return SpeculativeMode::kOn;
  if (s == "off") return SpeculativeMode::kOff;
  return std::nullopt;
}

const char* speculative_mode_name(SpeculativeMode m) {
  switch (m) {
    case SpeculativeMode::kOn: return "on";
    case SpeculativeMode::kAuto: return "auto";
    default: return "off";
  }
}

// ---- Cost model.

namespace {

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Expected distinct experts among `positions` tokens choosing top_k of n each, uniformly.
double expected_union(int n, int top_k, int positions) {
  if (n <= 0) return 0;
  return n * (1.0 - std::pow(1.0 - static_cast<double>(top_k) / n, positions));
}

}  // namespace

DraftCostModel DraftCostModel::from_config(const model::ModelConfig& c) {
  DraftCostModel m;
  double routed = 0, draft_routed = 0, head = 0;
  for (const model::WeightSpec& w : model::weight_inventory(c)) {
    const double b = static_cast<double>(w.n_bytes);
    const bool expert = contains(w.name, ".experts.");
    switch (w.group) {
      case model::WeightGroup::kBackbone:
        if (w.name == "embed.weight") break;  // rows per token
        if (w.name == "head.weight") head = b;
        if (expert) routed += b;
        else m.dense_bytes += b;
        break;
      case model::WeightGroup::kDspark:
        // main_proj runs on every observed position (plain steps too); the Markov embedding is a lookup.
        if (contains(w.name, "main_proj") || contains(w.name, "markov_head.embed")) break;
        if (expert) draft_routed += b;
        else m.draft_bytes += b;
        break;
      default: break;  // Engram rows are per token; the vision tower does not decode
    }
  }
  m.moe_layers = c.n_layers;
  m.n_experts = c.n_routed_experts;
  m.top_k = c.n_activated_experts;
  if (m.moe_layers > 0 && m.n_experts > 0) m.expert_bytes = routed / (static_cast<double>(m.moe_layers) * m.n_experts);
  const int dn = c.dspark_n_routed_experts > 0 ? c.dspark_n_routed_experts : c.n_routed_experts;
  const int dk = c.dspark_n_activated_experts > 0 ? c.dspark_n_activated_experts : c.n_activated_experts;
  if (c.n_mtp_layers > 0 && dn > 0) {
    const double per_expert = draft_routed / (static_cast<double>(c.n_mtp_layers) * dn);
    m.draft_bytes += c.n_mtp_layers * per_expert * expected_union(dn, dk, c.dspark_block_size);
  }
  m.draft_bytes += head;  // the shared head over the block's rows
  return m;
}

double DraftCostModel::pass_bytes(int positions) const {
  return dense_bytes + moe_layers * expert_bytes * expected_union(n_experts, top_k, positions);
}

double DraftCostModel::gain(int drafted, double expected_accepted) const {
  const double cost = draft_bytes + pass_bytes(drafted + 1);
  return cost > 0 ? (1.0 + expected_accepted) * pass_bytes(1) / cost : 1.0;
}

// ---- Guard.

DraftGuard::DraftGuard(const DraftCostModel& cost) : cost_(cost) {}

void DraftGuard::inherit(const DraftGuard& engine, double weight) {
  double total = 0;
  for (double t : engine.tried_) total += t;
  const double scale = total > weight ? weight / total : 1.0;
  for (int b = 0; b < kBins; ++b) {
    tried_[b] = engine.tried_[b] * scale;
    accepted_[b] = engine.accepted_[b] * scale;
  }
  next_skip_ = engine.next_skip_;
  skip_ = engine.skip_ > 0 ? next_skip_ / 2 : 0;
}

int DraftGuard::bin(float confidence) {
  const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(confidence)));
  return std::clamp(static_cast<int>(s * kBins), 0, kBins - 1);
}

double DraftGuard::acceptance(float confidence) const {
  double tried = 0, accepted = 0;
  for (int b = 0; b < kBins; ++b) {
    tried += tried_[b];
    accepted += accepted_[b];
  }
  const double overall = (accepted + kPrior * kPriorWeight) / (tried + kPriorWeight);
  const int b = bin(confidence);
  return (accepted_[b] + overall * kPriorWeight) / (tried_[b] + kPriorWeight);
}

bool DraftGuard::should_draft() {
  if (skip_ == 0) return true;
  if (--skip_ == 0) probe_ = true;
  return false;
}

void DraftGuard::back_off() {
  skip_ = next_skip_;
  next_skip_ = std::min(next_skip_ * 2, kMaxBackoff);
}

int DraftGuard::choose(std::span<const float> confidence, int max) {
  const int n = std::min<int>(max, static_cast<int>(confidence.size()));
  double chain = 1.0, expected = 0.0, best_gain = 0.0;
  int best = 0;
  for (int k = 1; k <= n; ++k) {
    chain *= acceptance(confidence[k - 1]);
    expected += chain;  // P(the first k drafts are all accepted), summed: E[accepted]
    const double g = cost_.gain(k, expected);
    if (g > best_gain) {
      best_gain = g;
      best = k;
    }
  }
  const bool probe = probe_;
  probe_ = false;
  if (best_gain >= 1.0) return best;
  if (probe && n >= 1) return 1;
  back_off();
  return 0;
}

void DraftGuard::record(std::span<const float> confidence, int drafted, int accepted) {
  // Positions after the first rejection were never tested.
  const int tested = std::min(drafted, accepted + 1);
  for (int i = 0; i < tested; ++i) {
    const int b = bin(confidence[i]);
    tried_[b] += 1;
    accepted_[b] += i < accepted ? 1 : 0;
  }
  if (cost_.gain(drafted, accepted) < 1.0) back_off();
  else next_skip_ = 2;
}

// ---- Speculative sampling.

void softmax_probs(const float* logits, size_t n, float temperature, std::vector<double>& out) {
  out.resize(n);
  const double t = std::max(static_cast<double>(temperature), 1e-5);
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]) / t);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += out[i] = std::exp(static_cast<double>(logits[i]) / t - mx);
  for (size_t i = 0; i < n; ++i) out[i] /= sum;
}

VerifyPick speculative_pick(std::span<const double> p, std::span<const double> q, int32_t token, ops::SampleRng& rng) {
  const double pt = p[token], qt = q[token];
  if (qt <= 0 || rng.next_uniform_open0() * qt <= pt) return {true, token};
  // norm(max(0, p - q)): inverse CDF with one uniform.
  double total = 0;
  for (size_t i = 0; i < p.size(); ++i) total += std::max(0.0, p[i] - q[i]);
  double u = rng.next_uniform_open0() * total;
  int32_t last = token;
  for (size_t i = 0; i < p.size(); ++i) {
    const double r = std::max(0.0, p[i] - q[i]);
    if (r <= 0) continue;
    last = static_cast<int32_t>(i);
    u -= r;
    if (u <= 0) break;
  }
  return {false, last};
}

// ---- Speculator.

std::unique_ptr<Speculator> Speculator::create(model::Model& model, bool guard) {
  if (!model.draft_head()) return nullptr;
  return std::unique_ptr<Speculator>(new Speculator(model, *model.draft_head(), guard));
}

Speculator::Speculator(model::Model& model, model::DraftHead& head, bool guard)
    : model_(model),
      head_(head),
      guard_(guard),
      cost_(DraftCostModel::from_config(model.config())),
      journal_(model.config(), model.plan(), head.block_size() + 1, model.options().kv_dtype),
      engine_guard_(cost_),
      vocab_(model.config().vocab_size),
      sample_vocab_(model.sampleable_vocab()) {
  rows_.resize((head.block_size() + 1) * vocab_);
  chunk_.reserve(head.block_size() + 1);
  p_.reserve(sample_vocab_);
  q_.reserve(sample_vocab_);
}

std::unique_ptr<Speculator::Sequence> Speculator::new_sequence(uint64_t seed) const {
  // The acceptance draws have their own stream (the sampler's stays the request's).
  auto s = std::unique_ptr<Sequence>(
      new Sequence{head_.new_state(), DraftGuard(cost_), ops::SampleRng(seed ^ 0x5DEECE66Dull), true, {}});
  s->guard.inherit(engine_guard_);
  return s;
}

void Speculator::observe(Sequence& s, size_t chunk, ThreadPool* pool) {
  if (!s.usable) return;
  if (Status st = head_.observe(s.state, model_.dspark_hidden(chunk), pool); !st.ok()) {
    CEDAR_LOG_DEBUG("speculative decoding off for a sequence: %s", st.to_string().c_str());
    s.usable = false;
  }
}

// Walks the verified rows: row i holds the model's distribution for the token after chunk_[i]. Sets
// accepted_ and returns the model's own token (the bonus after the accepted drafts).
Result<int32_t> Speculator::accept(Sequence& s, float temperature, int k, Sampler& sampler) {
  for (accepted_ = 0; accepted_ < k; ++accepted_) {
    float* row = rows_.data() + accepted_ * vocab_;
    const int32_t d = draft_.ids[accepted_];
    if (temperature <= 0) {
      CEDAR_ASSIGN_OR_RETURN(Sampler::Pick pick, sampler.pick(row, nullptr, 0));
      if (pick.token != d) return pick.token;
      continue;
    }
    softmax_probs(row, sample_vocab_, temperature, p_);
    softmax_probs(draft_.logits.data() + accepted_ * vocab_, sample_vocab_, temperature, q_);
    const VerifyPick pick = speculative_pick(p_, q_, d, s.rng);
    if (!pick.accepted) return pick.token;
  }
  // Every draft accepted: the model's token after the last one.
  CEDAR_ASSIGN_OR_RETURN(Sampler::Pick pick, sampler.pick(rows_.data() + k * vocab_, nullptr, 0));
  return pick.token;
}

Result<bool> Speculator::step(Sequence& s, model::SequenceState& seq, int32_t last_token, Sampler& sampler,
                              float temperature, int max_new, std::vector<int32_t>* tokens, ThreadPool* pool) {
  tokens->clear();
  // Drafts that could not all be emitted are not worth verifying: at least one draft and the
  // model's own token must fit (the sequence's capacity holds prompt + max_tokens + 1).
  const int max_draft = std::min(head_.block_size(), max_new - 1);
  if (!s.usable || max_draft < 1 || s.state.n_positions != seq.n_tokens || s.state.n_positions < 2) return false;
  if (guard_ && !s.guard.should_draft()) return false;
  model::DraftOptions dopt;
  dopt.temperature = temperature;
  dopt.rng = &s.rng;
  dopt.sample_vocab = sample_vocab_;
  if (Status st = head_.draft(s.state, last_token, dopt, &draft_, pool); !st.ok()) {
    CEDAR_LOG_DEBUG("speculative decoding off for a sequence: %s", st.to_string().c_str());
    s.usable = false;
    return false;
  }
  if (draft_filter_ && temperature <= 0) draft_filter_(seq.n_tokens, draft_.ids);
  const int k = guard_ ? s.guard.choose(draft_.confidence, max_draft) : max_draft;
  if (k == 0) return false;

  // Verify: [last_token, d1 .. dk] at positions n .. n + k, logits of every row.
  chunk_.assign(1, last_token);
  chunk_.insert(chunk_.end(), draft_.ids.begin(), draft_.ids.begin() + k);
  CEDAR_RETURN_IF_ERROR(journal_.begin(seq, k + 1));
  const model::SeqChunk chunk{&seq, chunk_};
  Status st = model_.forward_all_rows(
      chunk, [&](size_t first, size_t n, const float* logits) {
        std::copy(logits, logits + n * vocab_, rows_.begin() + first * vocab_);
      }, pool);
  if (!st.ok()) {
    journal_.abandon(seq);  // the state is void: the engine ends the request
    return st;
  }
  Result<int32_t> own = accept(s, temperature, k, sampler);
  if (!own.ok()) {
    journal_.abandon(seq);
    return own.status();
  }
  const int accepted = accepted_;
  s.guard.record(draft_.confidence, k, accepted);
  engine_guard_.record(draft_.confidence, k, accepted);
  s.counters.passes++;
  s.counters.drafted += static_cast<uint64_t>(k);
  s.counters.accepted += static_cast<uint64_t>(accepted);
  // Emitted: the accepted drafts, then the model's own token; cut after a stop id and at max_new.
  for (int i = 0; i < accepted; ++i) tokens->push_back(draft_.ids[i]);
  tokens->push_back(*own);
  for (size_t i = 0; i < tokens->size(); ++i)
    if (sampler.is_stop((*tokens)[i]) || static_cast<int>(i) + 1 >= max_new) {
      tokens->resize(i + 1);
      break;
    }
  // The state keeps the inputs of the emitted tokens' rows: last_token and all emitted but the last.
  const int keep = static_cast<int>(tokens->size());
  CEDAR_RETURN_IF_ERROR(journal_.rollback(seq, keep));
  model::DsparkHidden h = model_.dspark_hidden(0);
  h.n = std::min<size_t>(h.n, static_cast<size_t>(keep));
  if (Status ob = head_.observe(s.state, h, pool); !ob.ok()) {
    CEDAR_LOG_DEBUG("speculative decoding off for a sequence: %s", ob.to_string().c_str());
    s.usable = false;
  }
  return true;
}

}  // namespace cedar::runtime
