// The server-wide budget of request-body bytes in flight (ServerOptions::max_body_bytes_in_flight,
// --max-body-bytes-in-flight): without it only each body was limited, and 100 half-sent 15 MB bodies
// held 1.5 GB. HttpConnection takes a body's declared length when its header arrives (a chunked
// body's bytes as they arrive) and hands the hold to the request's handler, which gives it back.
#pragma once

#include <atomic>
#include <cstddef>

namespace cedar::serve {

// Request-body bytes held by all connections together (ServerOptions::max_body_bytes_in_flight).
class BodyBudget {
 public:
  explicit BodyBudget(size_t limit) : limit_(limit) {}
  bool take(size_t n) {
    size_t used = used_.load();
    do {
      if (limit_ > 0 && used + n > limit_) return false;
    } while (!used_.compare_exchange_weak(used, used + n));
    return true;
  }
  void give(size_t n) { used_.fetch_sub(n); }
  size_t used() const { return used_.load(); }
  size_t limit() const { return limit_; }

 private:
  const size_t limit_;  // 0: no limit (still counted)
  std::atomic<size_t> used_{0};
};

// What one request holds of the budget: its declared length up front, or a chunked body's bytes as
// they arrive; given back when the request's handler is done with it (or the read failed).
class BodyHold {
 public:
  explicit BodyHold(BodyBudget& budget) : budget_(budget) {}
  ~BodyHold() { budget_.give(held_); }
  BodyHold(const BodyHold&) = delete;
  BodyHold& operator=(const BodyHold&) = delete;
  bool grow_to(size_t bytes) {
    if (bytes <= held_) return true;
    if (!budget_.take(bytes - held_)) return false;
    held_ = bytes;
    return true;
  }

 private:
  BodyBudget& budget_;
  size_t held_ = 0;
};

}  // namespace cedar::serve
