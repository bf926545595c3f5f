// The compiled-grammar cache of constrained decoding: least recently used grammars leave first, and
// the bytes it holds (xgrammar's CompiledGrammar::MemorySizeBytes plus the key) never exceed its
// budget. xgrammar's own GrammarCompiler cache keeps every grammar for ever (~12 MB per schema on
// the V4 vocabulary: 200 schemas took a server from 113 MB to 2.7 GB), so cedar turns it off and
// keeps this one instead. Thread-safe; a lookup or an insert holds the lock for a few list
// operations only, never for a compilation.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace xgrammar {
class CompiledGrammar;
}  // namespace xgrammar

namespace cedar::constrain {

class CompiledGrammarCache {
 public:
  explicit CompiledGrammarCache(int64_t budget_bytes) : budget_(budget_bytes) {}

  // The grammar compiled for `key`, now the most recently used, or null.
  std::shared_ptr<const xgrammar::CompiledGrammar> find(const std::string& key);
  // Keeps `grammar` (`bytes`: its size) under `key`, evicting the least recently used grammars until
  // everything fits. A grammar larger than the whole budget is not kept. Matchers already started
  // hold their grammar by shared_ptr, so eviction never pulls one from under a running request.
  void insert(const std::string& key, std::shared_ptr<const xgrammar::CompiledGrammar> grammar, int64_t bytes);

  int64_t bytes() const;
  size_t entries() const;
  int64_t budget() const { return budget_; }

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const xgrammar::CompiledGrammar> grammar;
    int64_t bytes = 0;
  };
  const int64_t budget_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_key_;
  int64_t bytes_ = 0;
};

}  // namespace cedar::constrain
