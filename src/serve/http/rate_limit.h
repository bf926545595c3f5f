// Per-API-key limits of `cedar serve` (keyless clients share one bucket, the empty key):
//
//   KeySlots     generation requests in flight per key (--max-concurrent-per-key);
//   TokenBudget  tokens per minute per key (--max-tokens-per-minute-per-key): a token bucket that
//                holds at most N tokens and refills continuously at N per 60 s. A request is
//                admitted when the bucket holds its prompt plus its whole output budget
//                (max_tokens, or the server's default), which are taken then, as OpenAI counts
//                max_tokens against a tokens-per-minute limit; when the turn ends, the part of the
//                output budget it did not generate is given back. The bucket never goes below
//                zero, so a burst of concurrent requests cannot spend more than the bucket held
//                (charging output only at the end let one burst use 5x the budget).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

namespace cedar::serve {

class KeySlots {
 public:
  explicit KeySlots(int limit) : limit_(limit) {}
  bool acquire(const std::string& key);  // false when the key has `limit` requests in flight
  void release(const std::string& key);
  int limit() const { return limit_; }

 private:
  const int limit_;  // 0: no limit
  std::mutex mu_;
  std::unordered_map<std::string, int> in_use_;
};

class TokenBudget {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // tokens_per_minute 0: no limit. `clock` is for tests.
  explicit TokenBudget(int64_t tokens_per_minute, Clock clock = [] { return std::chrono::steady_clock::now(); });

  struct Decision {
    bool admitted = true;
    bool never = false;         // prompt + output budget is over the whole budget: no wait helps
    int64_t limit = 0;          // tokens per minute
    int64_t remaining = 0;      // tokens in the bucket after the decision (>= 0)
    int retry_after_seconds = 0;  // refused: whole seconds until the bucket holds the request
    double reset_seconds = 0;   // until the bucket is full again
  };
  // Takes prompt_tokens + output_budget from the key's bucket when it holds them; otherwise refuses.
  Decision admit(const std::string& key, int64_t prompt_tokens, int64_t output_budget = 0);
  // Gives back the part of an admitted output budget that a finished (or failed) turn did not use.
  void refund(const std::string& key, int64_t unused_tokens);
  bool enabled() const { return per_minute_ > 0; }
  int64_t limit() const { return per_minute_; }

 private:
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point at;
  };
  Bucket& refill(const std::string& key);  // under mu_
  Decision describe(const Bucket& b) const;

  const int64_t per_minute_;
  const Clock clock_;
  std::mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_;  // a key's first request creates its full bucket
};

}  // namespace cedar::serve
