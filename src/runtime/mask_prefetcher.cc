#include "runtime/mask_prefetcher.h"

#include <exception>

#include "core/check.h"
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
    CEDAR_CHECK(!pending_, "MaskPrefetcher::start called while the previous masks are still pending");
    constraints_.assign(constraints.begin(), constraints.end());  // capacity is kept between steps
    masks_.assign(constraints.size(), nullptr);
    errors_.assign(constraints.size(), nullptr);  // capacity kept between steps
    seconds_ = 0;
    pending_ = true;
  }
  cv_.notify_all();
}

std::string MaskPrefetcher::error(size_t i) const {
  if (!errors_[i]) return {};
  try {
    std::rethrow_exception(errors_[i]);
  } catch (const std::exception& e) {
    return e.what()[0] != '\0' ? e.what() : "constraint failed";
  } catch (...) {
    return "constraint failed with an unknown exception";
  }
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
    for (size_t i = 0; i < constraints_.size(); ++i) {
      if (constraints_[i] == nullptr) continue;
      // An exception must not leave this thread (it would end the process): it fails its request.
      try {
        masks_[i] = constraints_[i]->next_token_mask();
      } catch (...) {
        errors_[i] = std::current_exception();
      }
    }
    const double seconds = timer.seconds();
    lock.lock();
    seconds_ = seconds;
    pending_ = false;
    cv_.notify_all();
  }
}

}  // namespace cedar::runtime
