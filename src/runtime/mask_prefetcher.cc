#include "runtime/mask_prefetcher.h"

#include <chrono>
#include <exception>
#include <new>

#include "core/check.h"
#include "core/timer.h"

namespace cedar::runtime {

MaskPrefetcher::MaskPrefetcher(double budget_seconds, std::function<void()> on_ready)
    : budget_seconds_(budget_seconds), on_ready_(std::move(on_ready)) {
  std::lock_guard<std::mutex> lock(mu_);
  spawn_locked(/*slow_lane=*/false);
  spawn_locked(/*slow_lane=*/true);
}

MaskPrefetcher::~MaskPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  // A retired thread still inside a mask is waited for: the slot it writes is its own (shared_ptr),
  // but on_ready_ belongs to the engine being destroyed.
  for (auto& w : workers_) w->thread.join();
}

void MaskPrefetcher::spawn_locked(bool slow_lane) {
  // Threads that left are joined here, so the list stays as long as the threads alive.
  for (auto it = workers_.begin(); it != workers_.end();) {
    if ((*it)->exited) {
      (*it)->thread.join();
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  auto worker = std::make_unique<Worker>();
  worker->slow_lane = slow_lane;
  Worker* w = worker.get();
  if (!slow_lane) shared_worker_ = w;
  workers_.push_back(std::move(worker));
  w->thread = std::thread([this, w] { loop(w); });
}

void MaskPrefetcher::submit(const std::shared_ptr<MaskSlot>& slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    CEDAR_CHECK(!slot->pending, "MaskPrefetcher::submit called while the slot's mask is still pending");
    slot->pending = true;
    slot->mask = nullptr;
    slot->error = nullptr;
    (slot->slow ? slow_queue_ : shared_queue_).push_back(slot);
  }
  work_cv_.notify_all();
}

double MaskPrefetcher::wait(const std::vector<MaskSlot*>& slots) {
  Timer timer;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                                std::chrono::duration<double>(budget_seconds_));
  std::unique_lock<std::mutex> lock(mu_);
  const bool all_ready = done_cv_.wait_until(lock, deadline, [&] {
    for (const MaskSlot* s : slots)
      if (s->pending && !s->slow) return false;
    return true;
  });
  if (!all_ready && shared_worker_ && shared_worker_->current && retired_ < kMaxRetiredLanes) {
    // The shared lane is inside a mask over the budget: that constraint is slow from now on, and a
    // fresh thread takes the lane so the masks queued behind it go on.
    shared_worker_->current->slow = true;
    shared_worker_->retired = true;
    ++retired_;
    spawn_locked(/*slow_lane=*/false);
    lock.unlock();
    work_cv_.notify_all();
  }
  return timer.seconds();
}

void MaskPrefetcher::wait_for(const MaskSlot& slot) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return !slot.pending; });
}

bool MaskPrefetcher::ready(const MaskSlot& slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  return !slot.pending;
}

int MaskPrefetcher::retired_lanes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return retired_;
}

std::string MaskPrefetcher::error_message(const MaskSlot& slot) {
  if (!slot.error) return {};
  try {
    std::rethrow_exception(slot.error);
  } catch (const std::bad_alloc&) {
    return "out of memory computing the token mask";
  } catch (const std::exception& e) {
    return e.what()[0] != '\0' ? e.what() : "constraint failed";
  } catch (...) {
    return "constraint failed with an unknown exception";
  }
}

void MaskPrefetcher::loop(Worker* self) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::deque<std::shared_ptr<MaskSlot>>& queue = self->slow_lane ? slow_queue_ : shared_queue_;
    work_cv_.wait(lock, [&] { return stop_ || self->retired || !queue.empty(); });
    if (stop_ || self->retired) break;
    std::shared_ptr<MaskSlot> slot = std::move(queue.front());
    queue.pop_front();
    self->current = slot.get();
    // The engine reads the slot only once it is no longer pending: the computation runs unlocked.
    lock.unlock();
    Timer timer;
    const uint32_t* mask = nullptr;
    std::exception_ptr error;
    // An exception must not leave this thread (it would end the process): it fails its request.
    // std::bad_alloc included: a matcher that cannot get memory fails its own request only.
    try {
      mask = slot->constraint->next_token_mask();
    } catch (...) {
      error = std::current_exception();
    }
    const double seconds = timer.seconds();
    lock.lock();
    self->current = nullptr;
    slot->mask = mask;
    slot->error = error;
    slot->seconds = seconds;
    if (seconds > budget_seconds_) slot->slow = true;
    slot->pending = false;
    slot.reset();
    done_cv_.notify_all();
    if (on_ready_) {
      lock.unlock();
      on_ready_();
      lock.lock();
    }
  }
  if (self->retired) --retired_;
  self->exited = true;
}

}  // namespace cedar::runtime
