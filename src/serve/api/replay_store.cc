#include "serve/api/replay_store.h"

namespace cedar::serve {

void ReplayStore::remember(ReplayTurn turn) {
  if (turn.calls.empty() || capacity_ == 0) return;
  std::string key = turn.calls.front().id;
  std::lock_guard lock(mu_);
  if (turns_.insert_or_assign(key, std::move(turn)).second) order_.push_back(std::move(key));
  while (order_.size() > capacity_) {
    turns_.erase(order_.front());
    order_.pop_front();
  }
}

std::optional<ReplayTurn> ReplayStore::find(const std::string& first_call_id) const {
  std::lock_guard lock(mu_);
  auto it = turns_.find(first_call_id);
  if (it == turns_.end()) return std::nullopt;
  return it->second;
}

size_t ReplayStore::size() const {
  std::lock_guard lock(mu_);
  return turns_.size();
}

}  // namespace cedar::serve
