// ReplayStore: the exact text of recent assistant turns that called tools, so the next turn of the
// conversation re-renders them byte for byte and its prompt is the very token sequence the engine
// generated (see chat_service.h). Shared by the handler threads: locked.
#pragma once

#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "serve/api/chat_types.h"

namespace cedar::serve {

// One generated assistant turn that called tools, as the model wrote it.
struct ReplayTurn {
  std::vector<ToolCall> calls;  // what the client was told (ids included)
  std::string content;
  std::string reasoning;
  std::string raw;  // the output text after </think> (thinking mode) or from the start (chat mode),
                    // up to but excluding the EOS marker: content and DSML exactly as generated
};

// Bounded (oldest evicted first), keyed by the turn's first tool call id, which cedar generates
// unique per call. In memory only: after a restart turns re-render canonically.
class ReplayStore {
 public:
  explicit ReplayStore(size_t capacity = 4096) : capacity_(capacity) {}
  void remember(ReplayTurn turn);
  std::optional<ReplayTurn> find(const std::string& first_call_id) const;
  size_t size() const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, ReplayTurn> turns_;
  std::deque<std::string> order_;  // insertion order, for eviction
};

}  // namespace cedar::serve
