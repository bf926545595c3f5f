#include "serve/http/rate_limit.h"

#include <algorithm>
#include <cmath>

namespace cedar::serve {

bool KeySlots::acquire(const std::string& key) {
  if (limit_ <= 0) return true;
  std::lock_guard lock(mu_);
  int& n = in_use_[key];
  if (n >= limit_) return false;
  ++n;
  return true;
}

void KeySlots::release(const std::string& key) {
  if (limit_ <= 0) return;
  std::lock_guard lock(mu_);
  auto it = in_use_.find(key);
  if (it != in_use_.end() && --it->second == 0) in_use_.erase(it);
}

TokenBudget::TokenBudget(int64_t tokens_per_minute, Clock clock)
    : per_minute_(tokens_per_minute), clock_(std::move(clock)) {}

TokenBudget::Bucket& TokenBudget::refill(const std::string& key) {
  const auto now = clock_();
  auto [it, fresh] = buckets_.try_emplace(key, Bucket{static_cast<double>(per_minute_), now});
  Bucket& b = it->second;
  if (!fresh) {
    const double elapsed = std::chrono::duration<double>(now - b.at).count();
    b.tokens = std::min<double>(per_minute_, b.tokens + elapsed * static_cast<double>(per_minute_) / 60.0);
    b.at = now;
  }
  return b;
}

TokenBudget::Decision TokenBudget::describe(const Bucket& b) const {
  Decision d;
  d.limit = per_minute_;
  d.remaining = std::max<int64_t>(0, static_cast<int64_t>(std::floor(b.tokens)));
  d.reset_seconds = (static_cast<double>(per_minute_) - b.tokens) * 60.0 / static_cast<double>(per_minute_);
  return d;
}

TokenBudget::Decision TokenBudget::admit(const std::string& key, int64_t prompt_tokens, int64_t output_budget) {
  if (per_minute_ <= 0) return {};
  std::lock_guard lock(mu_);
  Bucket& b = refill(key);
  const int64_t cost = prompt_tokens + std::max<int64_t>(0, output_budget);
  const double need = static_cast<double>(cost);
  if (cost > per_minute_) {
    Decision d = describe(b);
    d.admitted = false;
    d.never = true;
    return d;
  }
  if (b.tokens >= need) {
    b.tokens -= need;
    return describe(b);
  }
  Decision d = describe(b);
  d.admitted = false;
  d.retry_after_seconds =
      std::max(1, static_cast<int>(std::ceil((need - b.tokens) * 60.0 / static_cast<double>(per_minute_))));
  return d;
}

void TokenBudget::refund(const std::string& key, int64_t unused_tokens) {
  if (per_minute_ <= 0 || unused_tokens <= 0) return;
  std::lock_guard lock(mu_);
  Bucket& b = refill(key);
  b.tokens = std::min<double>(static_cast<double>(per_minute_), b.tokens + static_cast<double>(unused_tokens));
}

}  // namespace cedar::serve
