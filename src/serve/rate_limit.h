// Per-API-key limits of `cedar serve` (keyless clients share one bucket, the empty key):
//
//   KeySlots     generation requests in flight per key (--max-concurrent-per-key);
//   TokenBudget  tokens per minute per key (--max-tokens-per-minute-per-key): a token bucket that
//                holds at most N tokens and refills continuously at N per 60 s. A request is
//                admitted when the bucket holds its prompt, which is then taken; the generated
//                tokens are taken when the turn ends (the bucket may go below zero then, and the
//                key waits until it refills). So over any minute a key spends about N tokens,
//                prompt + generated, and a burst of up to N is allowed after a quiet minute.
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
    bool never = false;         // the prompt alone is over the whole budget: no wait helps
    int64_t limit = 0;          // tokens per minute
    int64_t remaining = 0;      // tokens in the bucket after the decision (>= 0)
    int retry_after_seconds = 0;  // refused: whole seconds until the bucket holds the prompt
    double reset_seconds = 0;   // until the bucket is full again
  };
  // Takes `prompt_tokens` from the key's bucket when it holds them; otherwise refuses.
  Decision admit(const std::string& key, int64_t prompt_tokens);
  // Takes the tokens a finished turn generated.
  void charge(const std::string& key, int64_t tokens);
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
