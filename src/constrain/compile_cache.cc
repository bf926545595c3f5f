#include "constrain/compile_cache.h"

#include <malloc.h>

#include <vector>

namespace cedar::constrain {

std::shared_ptr<const xgrammar::CompiledGrammar> CompiledGrammarCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->grammar;
}

void CompiledGrammarCache::insert(const std::string& key, std::shared_ptr<const xgrammar::CompiledGrammar> grammar,
                                  int64_t bytes) {
  // The key (a schema, a pattern, the tools) is held too: count it.
  const int64_t size = bytes + static_cast<int64_t>(key.size());
  std::vector<std::shared_ptr<const xgrammar::CompiledGrammar>> evicted;  // freed after the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (by_key_.contains(key) || size > budget_) return;
    while (!lru_.empty() && bytes_ + size > budget_) {
      bytes_ -= lru_.back().bytes;
      by_key_.erase(lru_.back().key);
      evicted.push_back(std::move(lru_.back().grammar));
      lru_.pop_back();
    }
    lru_.push_front(Entry{key, std::move(grammar), size});
    by_key_.emplace(key, lru_.begin());
    bytes_ += size;
  }
  if (evicted.empty()) return;
  evicted.clear();
  // A compiled grammar is many mid-sized blocks (~12 MB on the V4 vocabulary) spread over the
  // compile and request threads' malloc arenas; glibc keeps freed blocks mapped, and without this
  // RSS settled ~2x over the budget. malloc_trim hands the free pages of every arena back.
  malloc_trim(0);
}

int64_t CompiledGrammarCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

size_t CompiledGrammarCache::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

}  // namespace cedar::constrain
