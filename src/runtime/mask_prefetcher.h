// Computes the next token masks of constrained requests while the model runs the step, and keeps
// a costly constraint from stalling the shared batch step.
//
// A grammar's mask for step t+1 depends only on the tokens accepted up to step t, so it can be
// computed during step t+1's forward pass instead of after it (vLLM and SGLang overlap structured
// output with the GPU the same way). On a machine with a core to spare the mask costs no wall time
// at all; where every core runs the model it still overlaps the forward pass's waits. The engine
// submits each constrained sequence's MaskSlot just before the forward pass and waits for them
// just after it; the masks are then read on the engine's thread.
//
// The mask budget: some grammars cost far more per token than others (`(a{1000}){1000}`: ~190 ms a
// token, where a JSON schema costs well under 1 ms). The step waits for the masks at most
// `budget_seconds` beyond the forward pass; a sequence whose mask is not ready then sits the step
// out (the engine parks it with its logits and samples once the mask is there) while the others go
// on. A constraint whose mask took longer than the budget is marked slow: its later masks are
// computed on a second thread, the slow lane, and the shared step never waits for them. A mask
// still running on the shared lane when a step gives up on it is marked slow at once, and its
// thread is handed a replacement for the shared lane (it leaves when that mask is done; at most
// kMaxRetiredLanes at once), so the masks queued behind it do not wait for it. One costly
// constraint costs the others at most one budget, once; its own request runs at the pace of its
// masks. Two persistent threads; no allocation per step once the batch size is seen.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine.h"

namespace cedar::runtime {

// How long past the forward pass a step waits for its masks (EngineOptions::mask_budget_seconds).
inline constexpr double kDefaultMaskBudgetSeconds = 0.05;
// Shared-lane threads replaced while still inside a costly mask, at most, at any time.
inline constexpr int kMaxRetiredLanes = 4;

// One constrained sequence's mask, computed by the prefetcher; the engine keeps one per request.
struct MaskSlot {
  explicit MaskSlot(std::shared_ptr<TokenConstraint> c) : constraint(std::move(c)) {}
  // Held by the slot (and the slot by the prefetcher while its mask is computed), so a request that
  // ends meanwhile cannot free it from under the mask thread.
  std::shared_ptr<TokenConstraint> constraint;
  // Valid once MaskPrefetcher::ready(): the mask (nullptr: every token allowed), or the exception
  // next_token_mask() threw (its request fails with it; the others go on).
  const uint32_t* mask = nullptr;
  std::exception_ptr error;
  double seconds = 0;  // what the last mask took to compute
  bool slow = false;   // a mask took longer than the budget: computed on the slow lane from then on
  bool pending = false;  // being computed (the prefetcher's lock guards it)
};

class MaskPrefetcher {
 public:
  // `on_ready` (may be empty) is called on a mask thread after each mask is done, without the
  // prefetcher's lock: the engine wakes its scheduler with it when a parked sequence can go on.
  explicit MaskPrefetcher(double budget_seconds = kDefaultMaskBudgetSeconds, std::function<void()> on_ready = {});
  ~MaskPrefetcher();
  MaskPrefetcher(const MaskPrefetcher&) = delete;
  MaskPrefetcher& operator=(const MaskPrefetcher&) = delete;

  // Starts computing the slot's next mask (on the slow lane when the slot is slow). Returns at once.
  // The slot must not be pending.
  void submit(const std::shared_ptr<MaskSlot>& slot);
  // Waits until every slot of `slots` that is not slow is ready, or `budget_seconds` have passed
  // since the call (then the shared lane's mask in progress, if any, becomes slow and its thread is
  // replaced). Returns the seconds it waited.
  double wait(const std::vector<MaskSlot*>& slots);
  // Waits until `slot` is ready, however long that takes.
  void wait_for(const MaskSlot& slot);
  bool ready(const MaskSlot& slot) const;
  // The message of slot.error ("" when none).
  static std::string error_message(const MaskSlot& slot);
  double budget_seconds() const { return budget_seconds_; }
  int retired_lanes() const;  // shared-lane threads replaced and still inside their mask

 private:
  struct Worker {
    std::thread thread;
    bool slow_lane = false;
    bool retired = false;  // replaced on the shared lane: leaves after its current mask
    bool exited = false;
    MaskSlot* current = nullptr;  // the slot it computes
  };
  void loop(Worker* self);
  void spawn_locked(bool slow_lane);

  const double budget_seconds_;
  const std::function<void()> on_ready_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  bool stop_ = false;
  std::deque<std::shared_ptr<MaskSlot>> shared_queue_, slow_queue_;
  std::deque<std::unique_ptr<Worker>> workers_;
  Worker* shared_worker_ = nullptr;  // the thread serving the shared lane now
  int retired_ = 0;
};

}  // namespace cedar::runtime
