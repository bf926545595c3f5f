#include "runtime/local_engine.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <limits>
#include <mutex>
#include <thread>

#include "core/log.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "model/model.h"
#include "ops/logprob.h"
#include "ops/sample.h"
#include "runtime/mask_prefetcher.h"
#include "runtime/prefix_store.h"

namespace cedar::runtime {
namespace {

// Masks the logits of the tokens `mask` (TokenConstraint::next_token_mask) does not allow: they get
// -inf, so neither argmax nor the exponential race can pick them. Whole words of allowed tokens
// are skipped and whole words of refused ones filled at once. Returns whether any of the first `n`
// tokens is allowed.
bool apply_token_mask(const uint32_t* mask, float* logits, size_t n) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  bool any = false;
  for (size_t word = 0; word * 32 < n; ++word) {
    const uint32_t bits = mask[word];
    const size_t end = std::min(n, word * 32 + 32);
    const uint32_t in_range = end - word * 32 == 32 ? 0xFFFFFFFFu : (1u << (end - word * 32)) - 1u;
    any = any || (bits & in_range) != 0;
    if (bits == 0xFFFFFFFFu) continue;
    if (bits == 0) {  // most words of a narrow mask: a plain fill
      std::fill(logits + word * 32, logits + end, kMasked);
      continue;
    }
    for (size_t i = word * 32; i < end; ++i)
      if (!((bits >> (i - word * 32)) & 1u)) logits[i] = kMasked;
  }
  return any;
}

// One request as the scheduler sees it. Owned by the caller's stack frame in generate(); the
// scheduler signals `done` and never touches it afterwards.
struct Job {
  const GenerationRequest* request = nullptr;
  GenerationResult result;
  Status status;
  bool done = false;
  std::condition_variable cv;
  // Scheduler-side state.
  std::unique_ptr<model::SequenceState> seq;
  std::unique_ptr<ops::SampleRng> rng;
  std::vector<int32_t> pending;  // tokens to feed in the next step
  // The alternatives of the token being reported (request.on_logprobs), reused every step.
  std::array<int32_t, kMaxTopLogprobs> top_ids{};
  std::array<float, kMaxTopLogprobs> top_logprobs{};
  Timer timer;
  bool prefilled = false;
  uint64_t state_bytes = 0;      // model::sequence_state_bytes of its capacity (memory limit)
  // Constrained requests: the next mask (MaskPrefetcher). A sequence whose mask was not ready when
  // its step ended is parked: it keeps that step's logits and sits out the steps until the mask
  // is there, while the rest of the batch goes on.
  std::shared_ptr<MaskSlot> mask_slot;
  bool parked = false;
  std::vector<float> parked_row;
};

class LocalEngine final : public Engine {
 public:
  LocalEngine(std::unique_ptr<model::Model> model, std::unique_ptr<PrefixStore> store, EngineOptions options,
              std::string id)
      : model_(std::move(model)), store_(std::move(store)), options_(options),
        pool_(options.threads > 0 ? options.threads : hardware_threads()),
        prefetch_(options.mask_budget_seconds, [this] {
          // A mask is ready: a parked sequence may go on.
          {
            std::lock_guard<std::mutex> lock(mu_);
            ++mask_events_;
          }
          cv_.notify_all();
        }) {
    info_.model_id = std::move(id);
    info_.vocab_size = model_->config().vocab_size;
    info_.bos_id = model_->config().bos_token_id;
    info_.eos_id = model_->config().eos_token_id;
    info_.max_context = options.max_context;
    thread_ = std::thread([this] { scheduler_loop(); });
  }

  ~LocalEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    // Routing statistics for a warm restart; a failure to write them must not fail the shutdown.
    if (Status st = model_->save_residency_stats(); !st.ok()) CEDAR_LOG_WARN("%s", st.message().c_str());
  }

  Result<GenerationResult> generate(const GenerationRequest& request) override {
    if (request.prompt_ids.empty()) return invalid_argument("the prompt is empty");
    const int64_t total = static_cast<int64_t>(request.prompt_ids.size()) + request.sampling.max_tokens;
    if (request.sampling.max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
    if (total > options_.max_context)
      return invalid_argument("prompt (" + std::to_string(request.prompt_ids.size()) + " tokens) + max_tokens (" +
                              std::to_string(request.sampling.max_tokens) + ") exceeds the context limit of " +
                              std::to_string(options_.max_context) + " tokens");
    for (int32_t id : request.prompt_ids)
      if (id < 0 || id >= info_.vocab_size)
        return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary");
    if (request.sampling.temperature < 0) return invalid_argument("temperature must be >= 0");
    if (request.top_logprobs < 0 || request.top_logprobs > kMaxTopLogprobs)
      return invalid_argument("top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "]");
    Job job;
    job.request = &request;
    job.state_bytes = model::sequence_state_bytes(model_->config(), model_->plan(), total + 1);
    if (options_.kv_memory_bytes > 0 && job.state_bytes > options_.kv_memory_bytes)
      return invalid_argument("this request needs " + std::to_string(job.state_bytes >> 20) +
                              " MiB of sequence state (prompt " + std::to_string(request.prompt_ids.size()) +
                              " + max_tokens " + std::to_string(request.sampling.max_tokens) +
                              " tokens), more than the server's KV memory limit of " +
                              std::to_string(options_.kv_memory_bytes >> 20) +
                              " MiB: lower max_tokens or shorten the prompt (or raise --kv-memory)");
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (static_cast<int>(waiting_.size()) >= options_.max_queue)
        return resource_exhausted("the request queue is full (" + std::to_string(options_.max_queue) +
                                  " waiting); retry later");
      waiting_.push_back(&job);
      ++stats_.queue_depth;
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> lock(mu_);
    job.cv.wait(lock, [&] { return job.done; });
    if (!job.status.ok()) return job.status;
    return std::move(job.result);
  }

  EngineInfo info() const override { return info_; }

  EngineStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s = stats_;
    if (store_) {
      s.kv_bytes_memory = store_->memory_stats().pool.blocks_in_use * store_->block_bytes();
      s.kv_bytes_disk = store_->disk_stats().bytes + store_->tail_stats().disk_bytes;
      s.prefix_levels = store_->level_stats();
    }
    return s;
  }

 private:
  void finish(Job* job, FinishReason reason, Status st = {}) {
    job->result.finish_reason = reason;
    // Keep the conversation's global KV for the next turn (memory, then disk).
    if (store_ && job->seq && job->request->cache_prefix && reason != FinishReason::kError) {
      Status saved = store_->save(*job->seq, static_cast<int64_t>(job->request->prompt_ids.size()));
      if (!saved.ok()) CEDAR_LOG_WARN("prefix cache: %s", saved.to_string().c_str());
    }
    job->result.decode_seconds = job->timer.seconds() - job->result.prefill_seconds - job->result.queue_seconds;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.requests++;
    stats_.output_tokens += job->result.output_ids.size();
    stats_.sequence_bytes -= job->state_bytes;
    job->status = std::move(st);
    job->seq.reset();
    job->done = true;
    job->cv.notify_all();
  }

  void scheduler_loop() {
    std::vector<Job*> active;
    std::vector<model::SeqChunk> chunks;
    std::vector<float> logits;
    std::vector<MaskSlot*> mask_slots;
    std::vector<Job*> stepping;  // the active jobs that are not parked: this step's batch
    std::vector<Job*> still;     // the jobs that go on after a step
    const size_t vocab = info_.vocab_size;
    uint64_t mask_events_seen = 0;
    for (;;) {
      // Parked sequences whose mask has come: their token now, then back into the batch.
      still.clear();
      for (Job* j : active) {
        if (j->parked && prefetch_.ready(*j->mask_slot)) {
          j->parked = false;
          if (!emit_token(j, j->parked_row.data())) continue;
        }
        still.push_back(j);
      }
      active.swap(still);
      const bool any_stepping = std::any_of(active.begin(), active.end(), [](const Job* j) { return !j->parked; });
      {
        std::unique_lock<std::mutex> lock(mu_);
        // Not `!waiting_.empty()` alone: while every running sequence is parked, a head that cannot
        // be admitted yet must not make this loop spin.
        const auto can_admit = [&] {
          return !waiting_.empty() && static_cast<int>(active.size()) < options_.max_batch &&
                 (options_.kv_memory_bytes == 0 ||
                  stats_.sequence_bytes + waiting_.front()->state_bytes <= options_.kv_memory_bytes);
        };
        cv_.wait(lock, [&] {
          return stop_ || any_stepping || can_admit() || (!active.empty() && mask_events_ != mask_events_seen);
        });
        mask_events_seen = mask_events_;
        if (stop_) {
          for (Job* j : waiting_) {
            j->status = failed_precondition("the engine is shutting down");
            j->done = true;
            j->cv.notify_all();
          }
          waiting_.clear();
          lock.unlock();
          for (Job* j : active) finish(j, FinishReason::kError, failed_precondition("the engine is shutting down"));
          return;
        }
        // First come, first served: the head waits (and blocks the others) until the running
        // sequences leave it room under the memory limit.
        while (!waiting_.empty() && static_cast<int>(active.size()) < options_.max_batch &&
               (options_.kv_memory_bytes == 0 ||
                stats_.sequence_bytes + waiting_.front()->state_bytes <= options_.kv_memory_bytes)) {
          Job* j = waiting_.front();
          waiting_.pop_front();
          --stats_.queue_depth;
          stats_.sequence_bytes += j->state_bytes;
          active.push_back(j);
        }
        stats_.active_sequences = static_cast<int>(active.size());
      }
      // Newly admitted jobs get their state; their prompt is this step's chunk.
      for (Job* j : active)
        if (!j->seq) {
          const auto& req = *j->request;
          if (req.constraint) j->mask_slot = std::make_shared<MaskSlot>(req.constraint);
          j->result.queue_seconds = j->timer.seconds();
          j->result.prompt_tokens = static_cast<int>(req.prompt_ids.size());
          j->seq = std::make_unique<model::SequenceState>(
              model_->new_sequence(static_cast<int64_t>(req.prompt_ids.size()) + req.sampling.max_tokens + 1));
          j->rng = std::make_unique<ops::SampleRng>(req.sampling.seed);
          j->pending = req.prompt_ids;
          int64_t cached = 0;
          if (store_) {
            auto plan = store_->restore(req.prompt_ids, options_.replay_full ? ReplayMode::kFull : ReplayMode::kBounded,
                                        *j->seq);
            if (plan.ok()) {
              cached = plan->cached_tokens;
              j->result.cached_tokens = static_cast<int>(plan->cached_tokens);
              j->result.replayed_tokens = static_cast<int>(plan->replayed_tokens());
              j->pending.assign(req.prompt_ids.begin() + plan->replay_from, req.prompt_ids.end());
            } else {
              CEDAR_LOG_WARN("prefix cache lookup failed, computing the prompt: %s", plan.status().to_string().c_str());
              *j->seq = model_->new_sequence(static_cast<int64_t>(req.prompt_ids.size()) + req.sampling.max_tokens + 1);
            }
          }
          std::lock_guard<std::mutex> lock(mu_);
          stats_.prompt_tokens += req.prompt_ids.size();
          stats_.cached_tokens += cached;
          stats_.replayed_tokens += j->result.replayed_tokens;
          (cached > 0 ? stats_.prefix_hits : stats_.prefix_misses)++;
        }
      stepping.clear();
      for (Job* j : active)
        if (!j->parked) stepping.push_back(j);
      if (stepping.empty()) continue;  // every sequence waits for its mask
      chunks.clear();
      size_t prefill_tokens = 0, decode_tokens = 0;
      for (Job* j : stepping) {
        chunks.push_back({j->seq.get(), j->pending});
        (j->prefilled ? decode_tokens : prefill_tokens) += j->pending.size();
      }
      logits.resize(chunks.size() * vocab);
      // Constrained requests: their next masks are computed beside the forward pass.
      mask_slots.clear();
      for (Job* j : stepping)
        if (j->mask_slot) {
          prefetch_.submit(j->mask_slot);
          mask_slots.push_back(j->mask_slot.get());
        }
      const bool constrained = !mask_slots.empty();
      Timer step;
      Status st = model_->forward(chunks, logits.data(), &pool_);
      const double forward_seconds = step.seconds();
      // Exposed mask time: what the step waits for the masks beyond the forward pass (at most the
      // mask budget; slow constraints are not waited for).
      const double mask_wait_seconds = constrained ? prefetch_.wait(mask_slots) : 0.0;
      double mask_seconds = 0;
      for (const MaskSlot* slot : mask_slots)
        if (prefetch_.ready(*slot)) mask_seconds += slot->seconds;
      {
        const double dt = forward_seconds, total = static_cast<double>(prefill_tokens + decode_tokens);
        std::lock_guard<std::mutex> lock(mu_);
        stats_.prefill_seconds += dt * static_cast<double>(prefill_tokens) / total;
        stats_.decode_seconds += dt * static_cast<double>(decode_tokens) / total;
        stats_.computed_prompt_tokens += prefill_tokens;
        stats_.decode_tokens += decode_tokens;
        stats_.constraint_seconds += mask_wait_seconds;
        stats_.constraint_mask_seconds += mask_seconds;
      }
      if (!st.ok()) {
        CEDAR_LOG_ERROR("forward failed: %s", st.to_string().c_str());
        for (Job* j : active) finish(j, FinishReason::kError, st);
        active.clear();
        continue;
      }
      still.clear();  // capacity kept between steps: no allocation per step
      for (Job* j : active)
        if (j->parked) still.push_back(j);
      for (size_t i = 0; i < stepping.size(); ++i) {
        Job* j = stepping[i];
        if (!j->prefilled) {
          j->prefilled = true;
          j->result.prefill_seconds = j->timer.seconds() - j->result.queue_seconds;
        }
        float* row = logits.data() + i * vocab;
        if (j->mask_slot && !prefetch_.ready(*j->mask_slot)) {
          // Its mask is late: the sequence sits out until it comes, the others go on.
          j->parked_row.assign(row, row + vocab);
          j->parked = true;
          {
            std::lock_guard<std::mutex> lock(mu_);
            stats_.constraint_parked_steps++;
          }
          still.push_back(j);
          continue;
        }
        if (emit_token(j, row)) still.push_back(j);
      }
      active.swap(still);
      std::lock_guard<std::mutex> lock(mu_);
      stats_.active_sequences = static_cast<int>(active.size());
    }
  }

  // Samples a token for `j` from its step's logits `row` (under its mask, which is ready), reports
  // it and ends the request when it stops. true: the sequence goes on (its next input is pending).
  bool emit_token(Job* j, float* row) {
    const auto& req = *j->request;
    if (j->mask_slot && j->mask_slot->error) {
      finish(j, FinishReason::kError,
             internal_error("constrained decoding: " + MaskPrefetcher::error_message(*j->mask_slot)));
      return false;
    }
    Timer constraint_timer;
    if (req.constraint && j->mask_slot->mask &&
        !apply_token_mask(j->mask_slot->mask, row, model_->sampleable_vocab())) {
      // A grammar with no way on (a pattern such as `[^\s\S]`, or a dead end after some output):
      // the client's constraint cannot be met, which is its error, not the server's.
      finish(j, FinishReason::kError,
             invalid_argument("the output constraint allows no token after " +
                              std::to_string(j->result.output_ids.size()) +
                              " output tokens: its schema or pattern cannot be completed"));
      return false;
    }
    double constraint_seconds = req.constraint ? constraint_timer.seconds() : 0.0;
    int32_t next = ops::sample_token(row, model_->sampleable_vocab(), req.sampling.temperature, *j->rng);
    bool resampled = false;
    if (req.constraint) {
      Timer closing_timer;
      // Near max_tokens: a token after which the output could no longer be completed in time is
      // sampled again from the narrower mask (a subset of the applied one) the constraint gives.
      const int left_after = req.sampling.max_tokens - static_cast<int>(j->result.output_ids.size()) - 1;
      // The constraint's calls may throw (std::bad_alloc in a matcher): that fails this request only.
      const uint32_t* narrower = nullptr;
      try {
        narrower = req.constraint->mask_to_finish_within(next, left_after);
      } catch (const std::exception& e) {
        finish(j, FinishReason::kError, internal_error(std::string("constrained decoding: ") + e.what()));
        return false;
      }
      if (narrower) {
        apply_token_mask(narrower, row, model_->sampleable_vocab());
        next = ops::sample_token(row, model_->sampleable_vocab(), req.sampling.temperature, *j->rng);
        resampled = true;
      }
      constraint_seconds += closing_timer.seconds();
    }
    j->result.output_ids.push_back(next);
    if (req.constraint) {
      Timer accept_timer;
      bool accepted = false;
      try {
        accepted = req.constraint->accept_token(next);
      } catch (const std::exception& e) {
        finish(j, FinishReason::kError, internal_error(std::string("constrained decoding: ") + e.what()));
        return false;
      }
      constraint_seconds += accept_timer.seconds();
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.constrained_tokens++;
        stats_.constraint_seconds += constraint_seconds;
        stats_.constraint_budget_resamples += resampled ? 1 : 0;
      }
      if (!accepted) {
        finish(j, FinishReason::kError,
               internal_error("constrained decoding: the grammar rejected sampled token " + std::to_string(next)));
        return false;
      }
    }
    // Under a constraint the masked row is the distribution sampled from: its log-softmax gives the
    // logprobs (tokens the grammar forbids have none).
    if (req.on_logprobs) {
      const size_t k = std::min<size_t>(static_cast<size_t>(req.top_logprobs), model_->sampleable_vocab());
      TokenLogprobsView view;
      view.token = next;
      view.logprob = ops::token_logprobs(row, model_->sampleable_vocab(), next, k, j->top_ids.data(),
                                         j->top_logprobs.data());
      view.top_ids = {j->top_ids.data(), k};
      view.top_logprobs = {j->top_logprobs.data(), k};
      req.on_logprobs(view);
    }
    const bool keep = !req.on_token || req.on_token(next);
    const bool is_stop = next == info_.eos_id || std::find(req.sampling.stop_ids.begin(), req.sampling.stop_ids.end(),
                                                           next) != req.sampling.stop_ids.end();
    if (!keep) finish(j, FinishReason::kCancelled);
    else if (is_stop) finish(j, FinishReason::kStop);
    else if (static_cast<int>(j->result.output_ids.size()) >= req.sampling.max_tokens) finish(j, FinishReason::kLength);
    else {
      j->pending.assign(1, next);
      return true;
    }
    return false;
  }

  std::unique_ptr<model::Model> model_;
  std::unique_ptr<PrefixStore> store_;  // used by the scheduler thread only (stats() reads counters)
  EngineOptions options_;
  ThreadPool pool_;
  EngineInfo info_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job*> waiting_;
  EngineStats stats_;
  bool stop_ = false;
  uint64_t mask_events_ = 0;  // masks finished (MaskPrefetcher's on_ready), under mu_
  // After mu_ and cv_, which its threads' on_ready uses: destroyed (its threads joined) first.
  MaskPrefetcher prefetch_;  // submitted to and read by the scheduler thread only
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<Engine>> make_engine(const std::string& model_dir, const EngineOptions& options) {
  model::ModelOptions mopts;
  if (options.index_keys_owner) mopts.index_keys = model::IndexKeyMode::kOwner;
  mopts.decoder_narrowing = options.decoder_narrowing;
  mopts.numerics = options.numerics;
  mopts.residency = options.residency;
  CEDAR_ASSIGN_OR_RETURN(auto model, model::Model::load(model_dir, mopts));
  std::unique_ptr<PrefixStore> store;
  if (options.prefix_cache) {
    PrefixStoreOptions po;
    po.disk_dir = options.cache_dir;
    po.disk_budget_bytes = options.cache_budget_bytes;
    po.block_tokens = options.kv_block_tokens;
    po.tier = options.kv_tier;
    CEDAR_ASSIGN_OR_RETURN(store, PrefixStore::create(*model, po));
  }
  std::string id = std::filesystem::path(model_dir).filename().string();
  if (id.empty()) id = std::filesystem::path(model_dir).parent_path().filename().string();
  return std::unique_ptr<Engine>(new LocalEngine(std::move(model), std::move(store), options, id));
}

}  // namespace cedar::runtime
