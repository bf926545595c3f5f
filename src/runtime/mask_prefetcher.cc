#include "runtime/mask_prefetcher.h"

#include "core/timer.h"

namespace cedar::runtime {

MaskPrefetcher::MaskPrefetcher() : thread_([this] { loop(); }) {}

MaskPrefetcher::~MaskPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void MaskPrefetcher::start(const std::vector<TokenConstraint*>& constraints) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    constraints_.assign(constraints.begin(), constraints.end());  // capacity is kept between steps
    masks_.assign(constraints.size(), nullptr);
    seconds_ = 0;
    pending_ = true;
  }
  cv_.notify_all();
}

double MaskPrefetcher::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !pending_; });
  return seconds_;
}

void MaskPrefetcher::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return pending_ || stop_; });
    if (stop_) return;
    // The engine thread only waits while pending_ is set, so the lists are not touched meanwhile;
    // the lock is released for the computation all the same, to keep wait() cheap to enter.
    lock.unlock();
    Timer timer;
    for (size_t i = 0; i < constraints_.size(); ++i)
      masks_[i] = constraints_[i] ? constraints_[i]->next_token_mask() : nullptr;
    const double seconds = timer.seconds();
    lock.lock();
    seconds_ = seconds;
    pending_ = false;
    cv_.notify_all();
  }
}

}  // namespace cedar::runtime
