// PrefixLru: the eviction policy of both prefix caches (in memory and on disk).
//
// Cached blocks form a forest: a block's parent is the block before it in its prefix. The policy
//   1. evicts only leaves, so a prefix is always trimmed from its end and no cached block is ever left
//      unreachable behind an evicted ancestor (a hit walks from the first block);
//   2. picks the least recently used leaf, where using a prefix stamps the same time on every block of
//      it (touch_path), so an ancestor is never older than its descendants;
//   3. is blind to prefix length: a long prefix is neither favoured nor penalised for its size.
// Consequence, the no-starvation guarantee the property tests check: a prefix P stays complete as long
// as the distinct blocks used at or after P's last use fit in the budget, whatever P's length. (Any
// victim is the oldest leaf; if it belonged to P, every cached block would be at least as recent as P,
// so the budget would already hold everything used since P.) Size-aware policies (evict the largest,
// GreedyDual-Size) fail this: a long prefix loses to any number of short ones.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cedar::kv {

class PrefixLru {
 public:
  using NodeId = uint64_t;
  static constexpr NodeId kNoParent = 0;  // node ids are nonzero

  // Adds a new leaf; `parent` must be present or kNoParent.
  void add(NodeId id, NodeId parent, uint64_t bytes, uint64_t tick);
  // Stamps `tick` on the node and every ancestor (ticks never move backwards).
  void touch_path(NodeId id, uint64_t tick);
  // Removes a leaf (removing a node with children is a bug: it would strand them).
  void remove(NodeId id);

  bool contains(NodeId id) const { return nodes_.count(id) > 0; }
  bool is_leaf(NodeId id) const;
  NodeId parent(NodeId id) const;
  uint64_t tick(NodeId id) const;
  uint64_t bytes(NodeId id) const;
  size_t size() const { return nodes_.size(); }
  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t max_tick() const { return max_tick_; }

  // The least recently used leaf among those `evictable` accepts (all when empty), oldest first.
  std::optional<NodeId> victim(const std::function<bool(NodeId)>& evictable = {}) const;
  // Every node id (unordered), for invariant checks.
  std::vector<NodeId> nodes() const;

 private:
  struct Node {
    NodeId parent = kNoParent;
    uint64_t bytes = 0;
    uint64_t tick = 0;
    uint32_t children = 0;
  };
  std::unordered_map<NodeId, Node> nodes_;
  std::set<std::pair<uint64_t, NodeId>> leaves_;  // (tick, id) of every leaf
  uint64_t total_bytes_ = 0;
  uint64_t max_tick_ = 0;
};

}  // namespace cedar::kv
