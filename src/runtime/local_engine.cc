#include "runtime/local_engine.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "core/log.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "model/model.h"
#include "runtime/mask_prefetcher.h"
#include "runtime/prefix_store.h"
#include "runtime/sampler.h"

namespace cedar::runtime {
namespace {

// A prefill piece [done, done + n) never cuts an image span (the reference prefills a span in one
// chunk): a span the budget would cut ends the piece before it, or, when the piece starts at the
// span, is taken whole even past the budget.
size_t chunk_around_images(const model::SequenceImages* images, size_t done, size_t n) {
  if (!images) return n;
  for (const model::ImageSpan& s : images->spans) {
    const size_t begin = static_cast<size_t>(s.start), end = static_cast<size_t>(s.end());
    if (begin < done + n && end > done + n) return begin > done ? begin - done : end - done;
  }
  return n;
}

// One request as the scheduler sees it, from submit() to its stream's end. The scheduler thread
// owns everything but `stream`, which readers share.
struct Job {
  GenerationRequest request;
  std::shared_ptr<GenerationStream> stream;
  GenerationResult result;
  Timer timer;                   // since submit()
  uint64_t state_bytes = 0;      // model::sequence_state_bytes of its capacity (memory limit)
  Status start_error;            // start() could not give it a sequence state
  // Scheduler-side state, from admission.
  std::unique_ptr<model::SequenceState> seq;
  std::optional<Sampler> sampler;
  size_t prompt_done = 0;        // prompt tokens whose forward has run (restored ones included)
  int32_t last_token = 0;        // the next input once the prompt is done
  std::span<const int32_t> step_tokens;  // this step's input
  bool samples_this_step = false;
  // Constrained requests: the next mask (MaskPrefetcher). A sequence whose mask was not ready when
  // its step ended is parked: it keeps that step's logits and sits out the steps until the mask
  // is there, while the rest of the batch goes on.
  std::shared_ptr<MaskSlot> mask_slot;
  std::unique_ptr<Speculator::Sequence> spec;  // its draft state (speculative decoding), or null
  bool parked = false;
  std::vector<float> parked_row;

  bool prefilling() const { return prompt_done < request.prompt_ids.size(); }
};

class LocalEngine final : public Engine {
 public:
  LocalEngine(std::unique_ptr<model::Model> model, std::unique_ptr<PrefixStore> store,
              std::unique_ptr<kv::KvCache> own_home, EngineOptions options, std::string id)
      : model_(std::move(model)), store_(std::move(store)), own_home_(std::move(own_home)),
        home_(store_ ? &store_->cache() : own_home_.get()), options_(options),
        pool_(options.threads > 0 ? options.threads : hardware_threads()),
        prefetch_(options.mask_budget_seconds, [this] { wake(&mask_events_); }) {
    info_.model_id = std::move(id);
    info_.vocab_size = model_->config().vocab_size;
    info_.bos_id = model_->config().bos_token_id;
    info_.eos_id = model_->config().eos_token_id;
    info_.max_context = options.max_context;
    info_.max_batch = options.max_batch;
    if (options.speculative != SpeculativeMode::kOff) speculator_ = Speculator::create(*model_, options.speculative_guard);
    info_.image_token_id = model_->config().image_token_id;
    info_.vision = model_->config().vision;
    if (store_) store_thread_ = std::thread([this] { store_loop(); });
    thread_ = std::thread([this] { scheduler_loop(); });
  }

  ~LocalEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    // The saves still queued reach the cache (the next process resumes from them), then the store
    // thread leaves.
    if (store_thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(store_mu_);
        store_stop_ = true;
      }
      store_cv_.notify_all();
      store_thread_.join();
    }
    // Routing statistics for a warm restart; a failure to write them must not fail the shutdown.
    if (Status st = model_->save_residency_stats(); !st.ok()) CEDAR_LOG_WARN("%s", st.message().c_str());
  }

  Result<std::shared_ptr<GenerationStream>> submit(GenerationRequest request) override {
    CEDAR_RETURN_IF_ERROR(check(request));
    auto job = std::make_unique<Job>();
    const int64_t total = static_cast<int64_t>(request.prompt_ids.size()) + request.sampling.max_tokens;
    job->state_bytes = model::sequence_state_bytes(home_->geometry(), total + 1);
    if (options_.kv_memory_bytes > 0 && job->state_bytes > options_.kv_memory_bytes)
      return invalid_argument("this request needs " + std::to_string(job->state_bytes >> 20) +
                              " MiB of sequence state (prompt " + std::to_string(request.prompt_ids.size()) +
                              " + max_tokens " + std::to_string(request.sampling.max_tokens) +
                              " tokens), more than the server's KV memory limit of " +
                              std::to_string(options_.kv_memory_bytes >> 20) +
                              " MiB: lower max_tokens or shorten the prompt (or raise --kv-memory)");
    job->stream = std::make_shared<GenerationStream>(request.logprobs);
    job->request = std::move(request);
    std::shared_ptr<GenerationStream> stream = job->stream;
    stream->set_cancel_listener([this] { wake(&cancel_events_); });
    std::vector<std::unique_ptr<Job>> dropped;  // cancelled while waiting: finished outside the lock
    Status refused;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!has_room()) take_cancelled_waiting(&dropped);
      if (stop_) refused = failed_precondition("the engine is shutting down");
      else if (!has_room())
        refused = resource_exhausted("the request queue is full (" + std::to_string(options_.max_queue) +
                                     " waiting); retry later");
      else waiting_.push_back(std::move(job));
      stats_.queue_depth = static_cast<int>(waiting_.size());
    }
    for (auto& j : dropped) finish_unstarted(*j, FinishReason::kCancelled, {});
    if (!refused.ok()) return refused;
    cv_.notify_all();
    return stream;
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
  Status check(const GenerationRequest& request) const {
    if (request.prompt_ids.empty()) return invalid_argument("the prompt is empty");
    if (request.sampling.max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
    const int64_t total = static_cast<int64_t>(request.prompt_ids.size()) + request.sampling.max_tokens;
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
    if (request.images && !request.images->empty()) {
      if (request.images->spans.back().end() > static_cast<int64_t>(request.prompt_ids.size()))
        return invalid_argument("an image span ends after the prompt (" + std::to_string(request.prompt_ids.size()) +
                                " tokens)");
      return model_->check_images(*request.images, request.prompt_ids, 0);
    }
    return {};
  }

  // Under mu_: whether a new request may wait (the batch's free places plus max_queue).
  bool has_room() const {
    const int free_places = std::max(0, options_.max_batch - stats_.active_sequences);
    return static_cast<int>(waiting_.size()) < options_.max_queue + free_places;
  }

  // A mask or a cancellation happened: the scheduler looks again (it never polls).
  void wake(uint64_t* events) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++*events;
    }
    cv_.notify_all();
  }

  // Under mu_: moves the waiting jobs whose clients cancelled into `out`.
  void take_cancelled_waiting(std::vector<std::unique_ptr<Job>>* out) {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if ((*it)->stream->cancelled()) {
        out->push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    stats_.queue_depth = static_cast<int>(waiting_.size());
  }

  // A job that never ran: no state to save. Never called under mu_ (the stream's lock comes first).
  void finish_unstarted(Job& job, FinishReason reason, Status st) {
    if (!st.ok()) {
      job.stream->finish(std::move(st));
      return;
    }
    job.result.finish_reason = reason;
    job.result.prompt_tokens = static_cast<int>(job.request.prompt_ids.size());
    job.result.queue_seconds = job.timer.seconds();
    job.stream->finish(std::move(job.result));
  }

  void finish(Job& job, FinishReason reason, Status st = {}) {
    job.result.finish_reason = reason;
    if (job.spec) {
      job.result.verify_passes = static_cast<int>(job.spec->counters.passes);
      job.result.drafted_tokens = static_cast<int>(job.spec->counters.drafted);
      job.result.accepted_tokens = static_cast<int>(job.spec->counters.accepted);
    }
    job.result.decode_seconds = job.timer.seconds() - job.result.prefill_seconds - job.result.queue_seconds;
    // Keep the conversation's global KV for the next turn (memory, then disk, then the shared
    // tier): the store thread saves it, so the step does not wait for the caches' I/O.
    // With images too: the home holds their positions' key ids (model/image_spans.h).
    const bool save = store_ && job.seq && job.request.cache_prefix && reason != FinishReason::kError &&
                      !job.prefilling();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.requests++;
      stats_.output_tokens += job.result.output_ids.size();
      stats_.sequence_bytes -= job.state_bytes;
      if (save) saving_bytes_ += job.state_bytes;  // still held until saved (the memory limit counts it)
      stats_.active_sequences--;
    }
    if (save) {
      StoreTask task;
      task.save = std::move(job.seq);
      task.prompt_tokens = static_cast<int64_t>(job.request.prompt_ids.size());
      task.state_bytes = job.state_bytes;
      post_store(std::move(task));
    }
    job.seq.reset();
    if (st.ok()) job.stream->finish(std::move(job.result));
    else job.stream->finish(std::move(st));
  }

  // Gives an admitted job its sequence state, restoring the longest cached prefix of its prompt.
  void start(Job& j) {
    const GenerationRequest& req = j.request;
    if (req.constraint) j.mask_slot = std::make_shared<MaskSlot>(req.constraint);
    j.sampler.emplace(j.request, model_->sampleable_vocab(), info_.eos_id);
    if (speculator_ && !req.constraint) j.spec = speculator_->new_sequence(req.sampling.seed);
    j.result.queue_seconds = j.timer.seconds();
    j.result.prompt_tokens = static_cast<int>(req.prompt_ids.size());
    const int64_t capacity = static_cast<int64_t>(req.prompt_ids.size()) + req.sampling.max_tokens + 1;
    auto fresh = model_->new_sequence(capacity, *home_);
    if (!fresh.ok()) {
      j.start_error = fresh.status();
      return;
    }
    j.seq = std::make_unique<model::SequenceState>(std::move(*fresh));
    int64_t cached = 0;
    if (store_) {
      auto plan = store_->restore(req.prompt_ids, options_.replay_full ? ReplayMode::kFull : ReplayMode::kBounded,
                                  *j.seq, req.images.get());
      if (plan.ok()) {
        cached = plan->cached_tokens;
        j.result.cached_tokens = static_cast<int>(plan->cached_tokens);
        j.result.replayed_tokens = static_cast<int>(plan->replayed_tokens());
        j.prompt_done = static_cast<size_t>(plan->replay_from);
      } else {
        CEDAR_LOG_WARN("prefix cache lookup failed, computing the prompt: %s", plan.status().to_string().c_str());
        j.seq.reset();  // its blocks go back before the fresh state takes any
        auto again = model_->new_sequence(capacity, *home_);
        if (!again.ok()) {
          j.start_error = again.status();
          return;
        }
        j.seq = std::make_unique<model::SequenceState>(std::move(*again));
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.prompt_tokens += req.prompt_ids.size();
    stats_.cached_tokens += cached;
    stats_.replayed_tokens += j.result.replayed_tokens;
    (cached > 0 ? stats_.prefix_hits : stats_.prefix_misses)++;
  }

  // The prefix store's own thread runs every restore (at admission) and save (at a request's end),
  // in order, so a save reaches the cache before a later request looks for it, and the scheduler
  // never waits for the disk cache or the shared tier: a slow Redis or disk delays only the request
  // being admitted, never the running batch.
  struct StoreTask {
    Job* restore = nullptr;                       // a job to start (owned by preparing_)
    std::unique_ptr<model::SequenceState> save;   // or a finished sequence to save
    int64_t prompt_tokens = 0;
    uint64_t state_bytes = 0;
  };

  void post_store(StoreTask task) {
    {
      std::lock_guard<std::mutex> lock(store_mu_);
      store_tasks_.push_back(std::move(task));
    }
    store_cv_.notify_one();
  }

  void store_loop() {
    for (;;) {
      StoreTask task;
      {
        std::unique_lock<std::mutex> lock(store_mu_);
        store_cv_.wait(lock, [&] { return store_stop_ || !store_tasks_.empty(); });
        if (store_tasks_.empty()) return;  // stopping, and every save is done
        task = std::move(store_tasks_.front());
        store_tasks_.pop_front();
      }
      if (task.restore) {
        start(*task.restore);
        {
          std::lock_guard<std::mutex> lock(mu_);
          prepared_.push_back(task.restore);
        }
        cv_.notify_all();
        continue;
      }
      Status saved = store_->save(*task.save, task.prompt_tokens);
      if (!saved.ok()) CEDAR_LOG_WARN("prefix cache: %s", saved.to_string().c_str());
      task.save.reset();
      {
        std::lock_guard<std::mutex> lock(mu_);
        saving_bytes_ -= task.state_bytes;  // room for a waiting request
      }
      cv_.notify_all();
    }
  }

  // Under mu_: whether the head of the queue may join the running batch now (first come, first
  // served: the head waits, and blocks the others, until the running sequences leave it room).
  bool can_admit() const {
    return !waiting_.empty() && stats_.active_sequences < options_.max_batch &&
           (options_.kv_memory_bytes == 0 ||
            stats_.sequence_bytes + saving_bytes_ + waiting_.front()->state_bytes <= options_.kv_memory_bytes);
  }

  // Moves jobs back from the store thread, their cached prefix restored, into the running batch.
  void adopt_prepared(const std::vector<Job*>& jobs) {
    for (Job* j : jobs) {
      auto it = std::find_if(preparing_.begin(), preparing_.end(), [&](const auto& p) { return p.get() == j; });
      std::unique_ptr<Job> job = std::move(*it);
      preparing_.erase(it);
      activate(std::move(job));
    }
  }

  // A started job joins the running batch, or ends here when it got no sequence state.
  void activate(std::unique_ptr<Job> j) {
    if (!j->seq) {
      finish(*j, FinishReason::kError, j->start_error);
      return;
    }
    active_.push_back(std::move(j));
  }

  // Waits for work, then admits what fits. false: the engine stops (everything is finished).
  bool admit() {
    std::vector<std::unique_ptr<Job>> dropped, admitted;
    std::vector<Job*> ready;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const bool any_stepping = std::any_of(active_.begin(), active_.end(), [](const auto& j) { return !j->parked; });
      cv_.wait(lock, [&] {
        return stop_ || any_stepping || can_admit() || !prepared_.empty() || mask_events_ != mask_events_seen_ ||
               cancel_events_ != cancel_events_seen_;
      });
      mask_events_seen_ = mask_events_;
      cancel_events_seen_ = cancel_events_;
      take_cancelled_waiting(&dropped);
      if (stop_) {
        stopping = true;
        for (auto& j : waiting_) dropped.push_back(std::move(j));
        waiting_.clear();
      }
      while (!stopping && can_admit()) {
        stats_.sequence_bytes += waiting_.front()->state_bytes;
        stats_.active_sequences++;
        admitted.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
      stats_.queue_depth = static_cast<int>(waiting_.size());
      ready.swap(prepared_);
    }
    adopt_prepared(ready);
    for (auto& j : dropped)
      finish_unstarted(*j, FinishReason::kCancelled,
                       stopping && !j->stream->cancelled() ? failed_precondition("the engine is shutting down")
                                                           : Status{});
    if (stopping) {
      // Jobs the store thread is restoring come back first (it owns them until then).
      while (!preparing_.empty()) {
        std::vector<Job*> back;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return !prepared_.empty(); });
          back.swap(prepared_);
        }
        adopt_prepared(back);
      }
      for (auto& j : active_) finish(*j, FinishReason::kError, failed_precondition("the engine is shutting down"));
      active_.clear();
      return false;
    }
    for (auto& j : admitted) {
      if (!store_) {  // nothing to restore: no I/O, the job starts at once
        start(*j);
        activate(std::move(j));
        continue;
      }
      StoreTask task;
      task.restore = j.get();
      preparing_.push_back(std::move(j));
      post_store(std::move(task));
    }
    // Cancelled running sequences end at this step boundary.
    retire([&](Job& j) {
      if (!j.stream->cancelled()) return true;
      finish(j, FinishReason::kCancelled);
      return false;
    });
    return true;
  }

  // Keeps the active jobs for which `keep` returns true, in order.
  template <typename Keep>
  void retire(Keep keep) {
    size_t out = 0;
    for (size_t i = 0; i < active_.size(); ++i)
      if (keep(*active_[i])) active_[out++] = std::move(active_[i]);
    active_.resize(out);
  }

  void scheduler_loop() {
    std::vector<Job*> stepping;  // this step's batch
    std::vector<model::SeqChunk> chunks;
    std::vector<float> logits;
    std::vector<MaskSlot*> mask_slots;
    const size_t vocab = info_.vocab_size;
    for (;;) {
      // Parked sequences whose mask has come: their token now, then back into the batch.
      retire([&](Job& j) {
        if (!j.parked || !prefetch_.ready(*j.mask_slot)) return true;
        j.parked = false;
        return emit_token(j, j.parked_row.data());
      });
      if (!admit()) return;
      if (speculator_ && speculative_step()) continue;
      // The step: one decode token of every decoding sequence, and prompt chunks within the budget.
      stepping.clear();
      chunks.clear();
      size_t prefill_budget = options_.prefill_chunk > 0 ? static_cast<size_t>(options_.prefill_chunk) : SIZE_MAX;
      size_t prefill_tokens = 0, decode_tokens = 0;
      for (auto& jp : active_) {
        Job& j = *jp;
        if (j.parked) continue;
        if (j.prefilling()) {
          size_t n = std::min(j.request.prompt_ids.size() - j.prompt_done, prefill_budget);
          if (n == 0) continue;  // the budget is spent: next step
          n = chunk_around_images(j.request.images.get(), j.prompt_done, n);
          prefill_budget -= std::min(n, prefill_budget);
          prefill_tokens += n;
          j.step_tokens = std::span<const int32_t>(j.request.prompt_ids).subspan(j.prompt_done, n);
          j.samples_this_step = j.prompt_done + n == j.request.prompt_ids.size();
        } else {
          j.step_tokens = {&j.last_token, 1};
          j.samples_this_step = true;
          ++decode_tokens;
        }
        stepping.push_back(&j);
        chunks.push_back({j.seq.get(), j.step_tokens, j.prefilling() ? j.request.images.get() : nullptr});
      }
      if (stepping.empty()) continue;  // every sequence waits for its mask
      logits.resize(chunks.size() * vocab);
      // Constrained requests about to sample: their next masks are computed beside the forward pass.
      mask_slots.clear();
      for (Job* j : stepping)
        if (j->mask_slot && j->samples_this_step) {
          prefetch_.submit(j->mask_slot);
          mask_slots.push_back(j->mask_slot.get());
        }
      Timer step;
      Status st = model_->forward(chunks, logits.data(), &pool_);
      const double forward_seconds = step.seconds();
      // Exposed mask time: what the step waits for the masks beyond the forward pass (at most the
      // mask budget; slow constraints are not waited for).
      const double mask_wait_seconds = mask_slots.empty() ? 0.0 : prefetch_.wait(mask_slots);
      double mask_seconds = 0;
      for (const MaskSlot* slot : mask_slots)
        if (prefetch_.ready(*slot)) mask_seconds += slot->seconds;
      {
        const double total = static_cast<double>(prefill_tokens + decode_tokens);
        std::lock_guard<std::mutex> lock(mu_);
        stats_.prefill_seconds += forward_seconds * static_cast<double>(prefill_tokens) / total;
        stats_.decode_seconds += forward_seconds * static_cast<double>(decode_tokens) / total;
        stats_.computed_prompt_tokens += prefill_tokens;
        stats_.decode_tokens += decode_tokens;
        stats_.constraint_seconds += mask_wait_seconds;
        stats_.constraint_mask_seconds += mask_seconds;
      }
      if (!st.ok()) {
        CEDAR_LOG_ERROR("forward failed: %s", st.to_string().c_str());
        for (auto& j : active_) finish(*j, FinishReason::kError, st);
        active_.clear();
        continue;
      }
      for (size_t i = 0; i < stepping.size(); ++i)  // the draft states follow every position
        if (stepping[i]->spec) speculator_->observe(*stepping[i]->spec, i, &pool_);
      for (size_t i = 0; i < stepping.size(); ++i) {
        Job& j = *stepping[i];
        if (j.prefilling()) j.prompt_done += j.step_tokens.size();
        if (!j.prefilling() && j.request.images) {  // the patches and span embeddings are done with
          for (model::ImageSpan& span : j.request.images->spans) std::vector<uint16_t>().swap(span.patches);
          std::vector<std::vector<float>>().swap(j.request.images->embeddings);
          j.request.images.reset();
        }
        j.step_tokens = {};
        if (!j.samples_this_step) continue;
        if (j.result.output_ids.empty()) j.result.prefill_seconds = j.timer.seconds() - j.result.queue_seconds;
        float* row = logits.data() + i * vocab;
        if (j.mask_slot && !prefetch_.ready(*j.mask_slot)) {
          // Its mask is late: the sequence sits out until it comes, the others go on.
          j.parked_row.assign(row, row + vocab);
          j.parked = true;
          std::lock_guard<std::mutex> lock(mu_);
          stats_.constraint_parked_steps++;
          continue;
        }
        emit_token(j, row);  // a finished job has no state left: retired below
      }
      retire([](Job& j) { return j.seq != nullptr; });
    }
  }

  // Samples a token for `j` from its step's logits `row` (under its mask, which is ready), reports
  // it and ends the request when it stops. true: the sequence goes on (its next input is
  // last_token); false: it finished (its state is released).
  bool emit_token(Job& j, float* row) {
    if (j.mask_slot && j.mask_slot->error) {
      finish(j, FinishReason::kError,
             internal_error("constrained decoding: " + MaskPrefetcher::error_message(*j.mask_slot)));
      return false;
    }
    const uint32_t* mask = j.mask_slot ? j.mask_slot->mask : nullptr;
    Result<Sampler::Pick> pick = j.sampler->pick(row, mask, static_cast<int>(j.result.output_ids.size()));
    if (!pick.ok()) {
      finish(j, FinishReason::kError, pick.status());
      return false;
    }
    if (pick->constrained) {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.constrained_tokens++;
      stats_.constraint_seconds += pick->constraint_seconds;
      stats_.constraint_budget_resamples += pick->resampled ? 1 : 0;
    }
    return emit_chosen(j, pick->token, row);
  }

  // Speculative decoding (runtime/speculative.h) when one sequence runs alone and is decoding: one
  // verify pass emits the accepted drafts and the model's own token. false: no speculative step this
  // time (the guard backs off, or the batch is not a lone decoding sequence): the plain step runs.
  bool speculative_step() {
    if (active_.size() != 1 || !preparing_.empty()) return false;
    Job& j = *active_[0];
    if (!j.spec || j.parked || j.prefilling() || j.mask_slot || j.result.output_ids.empty()) return false;
    const int max_new = j.request.sampling.max_tokens - static_cast<int>(j.result.output_ids.size());
    Timer step;
    const SpeculativeCounters before = j.spec->counters;
    Result<bool> ran = speculator_->step(*j.spec, *j.seq, j.last_token, *j.sampler, j.request.sampling.temperature,
                                         max_new, &spec_tokens_, &pool_);
    if (ran.ok() && !*ran) return false;
    if (!ran.ok()) {
      CEDAR_LOG_ERROR("speculative step failed: %s", ran.status().to_string().c_str());
      finish(j, FinishReason::kError, ran.status());
      active_.clear();
      return true;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.decode_seconds += step.seconds();
      stats_.decode_tokens += spec_tokens_.size();
      stats_.verify_passes += j.spec->counters.passes - before.passes;
      stats_.drafted_tokens += j.spec->counters.drafted - before.drafted;
      stats_.accepted_tokens += j.spec->counters.accepted - before.accepted;
    }
    for (size_t i = 0; i < spec_tokens_.size(); ++i)
      if (!emit_chosen(j, spec_tokens_[i], speculator_->row(i))) break;
    retire([](Job& job) { return job.seq != nullptr; });
    return true;
  }

  // Reports `next` (sampled from `row`) and ends the request when it stops; as emit_token.
  bool emit_chosen(Job& j, int32_t next, const float* row) {
    const GenerationRequest& req = j.request;
    j.result.output_ids.push_back(next);
    TokenLogprobsView view;
    if (req.logprobs) view = j.sampler->logprobs(row, next);
    const bool keep = j.stream->push(next, req.logprobs ? &view : nullptr);
    if (!keep) finish(j, FinishReason::kCancelled);
    else if (j.sampler->is_stop(next)) finish(j, FinishReason::kStop);
    else if (static_cast<int>(j.result.output_ids.size()) >= req.sampling.max_tokens) finish(j, FinishReason::kLength);
    else {
      j.last_token = next;
      return true;
    }
    return false;
  }

  std::unique_ptr<model::Model> model_;
  std::unique_ptr<PrefixStore> store_;  // used by the store thread only (stats() reads counters)
  std::unique_ptr<kv::KvCache> own_home_;  // the KV home when there is no prefix store
  kv::KvCache* home_;                     // where every sequence's KV lives (the store's cache, or own_home_)
  EngineOptions options_;
  ThreadPool pool_;
  EngineInfo info_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Job>> waiting_;
  EngineStats stats_;
  bool stop_ = false;
  uint64_t mask_events_ = 0, cancel_events_ = 0;  // under mu_
  uint64_t saving_bytes_ = 0;      // under mu_: states of finished sequences waiting to be saved
  std::vector<Job*> prepared_;     // under mu_: jobs the store thread has started, for the scheduler
  // Scheduler thread only.
  std::vector<std::unique_ptr<Job>> active_;
  std::vector<std::unique_ptr<Job>> preparing_;  // admitted, being restored by the store thread
  std::unique_ptr<Speculator> speculator_;        // null: no speculative decoding
  std::vector<int32_t> spec_tokens_;              // a speculative step's emitted ids
  uint64_t mask_events_seen_ = 0, cancel_events_seen_ = 0;
  // After mu_ and cv_, which its threads' on_ready uses: destroyed (its threads joined) first.
  MaskPrefetcher prefetch_;  // submitted to and read by the scheduler thread only
  std::mutex store_mu_;
  std::condition_variable store_cv_;
  std::deque<StoreTask> store_tasks_;
  bool store_stop_ = false;
  std::thread store_thread_;
  std::thread thread_;
};

std::string model_id_of(const std::string& model_dir) {
  std::string id = std::filesystem::path(model_dir).filename().string();
  if (id.empty()) id = std::filesystem::path(model_dir).parent_path().filename().string();
  return id;
}

}  // namespace

Result<std::unique_ptr<Engine>> make_engine(std::unique_ptr<model::Model> model, const EngineOptions& options,
                                            std::string model_id) {
  // The KV home's pool has room for every running sequence at full length, twice over (finished
  // ones keep their blocks until the store thread has indexed them), beside the cached prefixes.
  // It is address space: pages are touched only when a block is first written.
  const uint64_t per_sequence =
      kv::blocks_for_tokens(static_cast<int64_t>(options.max_context) + 1, std::max<uint32_t>(options.kv_block_tokens, 1));
  const uint64_t live_blocks = 2 * per_sequence * static_cast<uint64_t>(std::max(options.max_batch, 1)) + 1;
  if (live_blocks >= kv::kNoBlock)
    return invalid_argument("the KV pool for --parallel " + std::to_string(options.max_batch) + " x --ctx-size " +
                            std::to_string(options.max_context) + " needs more than 2^32 blocks: raise --kv-block-tokens");
  std::unique_ptr<PrefixStore> store;
  std::unique_ptr<kv::KvCache> own_home;
  if (options.prefix_cache) {
    PrefixStoreOptions po;
    po.disk_dir = options.cache_dir;
    po.disk_budget_bytes = options.cache_budget_bytes;
    po.block_tokens = options.kv_block_tokens;
    po.live_blocks = static_cast<uint32_t>(live_blocks);
    po.tier = options.kv_tier;
    CEDAR_ASSIGN_OR_RETURN(store, PrefixStore::create(*model, po));
  } else {
    CEDAR_ASSIGN_OR_RETURN(const kv::CacheGeometry geometry, model->kv_geometry(options.kv_block_tokens));
    kv::KvCacheOptions ko;
    ko.capacity_blocks = static_cast<uint32_t>(live_blocks);
    CEDAR_ASSIGN_OR_RETURN(own_home, kv::KvCache::create(geometry, ko));
  }
  if (options.speculative == SpeculativeMode::kOn && !model->draft_head())
    return invalid_argument(
        "--speculative on needs a checkpoint with DSpark stages (mtp.* tensors) loaded with its draft head; "
        "use --speculative auto or off");
  return std::unique_ptr<Engine>(
      new LocalEngine(std::move(model), std::move(store), std::move(own_home), options, std::move(model_id)));
}

Result<std::unique_ptr<Engine>> make_engine(const std::string& model_dir, const EngineOptions& options) {
  model::ModelOptions mopts;
  if (options.index_keys_owner) mopts.index_keys = model::IndexKeyMode::kOwner;
  mopts.decoder_narrowing = options.decoder_narrowing;
  mopts.numerics = options.numerics;
  mopts.residency = options.residency;
  CEDAR_ASSIGN_OR_RETURN(auto model, model::Model::load(model_dir, mopts));
  return make_engine(std::move(model), options, model_id_of(model_dir));
}

}  // namespace cedar::runtime
