#include "kv/prefix_lru.h"

#include "core/check.h"

namespace cedar::kv {

void PrefixLru::add(NodeId id, NodeId parent, uint64_t bytes, uint64_t tick) {
  CEDAR_CHECK(id != kNoParent && !nodes_.count(id), "prefix node %llu added twice", (unsigned long long)id);
  if (parent != kNoParent) {
    auto it = nodes_.find(parent);
    CEDAR_CHECK(it != nodes_.end(), "prefix node parent %llu missing", (unsigned long long)parent);
    if (it->second.children++ == 0) leaves_.erase({it->second.tick, parent});
  }
  nodes_[id] = Node{parent, bytes, tick, 0};
  leaves_.insert({tick, id});
  total_bytes_ += bytes;
  if (tick > max_tick_) max_tick_ = tick;
  // A child is as recent as its parent's newest use: keep ancestors at least as new.
  touch_path(id, tick);
}

void PrefixLru::touch_path(NodeId id, uint64_t tick) {
  if (tick > max_tick_) max_tick_ = tick;
  for (NodeId cur = id; cur != kNoParent;) {
    auto it = nodes_.find(cur);
    CEDAR_CHECK(it != nodes_.end(), "touch of missing prefix node %llu", (unsigned long long)cur);
    Node& n = it->second;
    if (n.tick < tick) {
      if (n.children == 0) {
        leaves_.erase({n.tick, cur});
        leaves_.insert({tick, cur});
      }
      n.tick = tick;
    }
    cur = n.parent;
  }
}

void PrefixLru::remove(NodeId id) {
  auto it = nodes_.find(id);
  CEDAR_CHECK(it != nodes_.end(), "remove of missing prefix node %llu", (unsigned long long)id);
  CEDAR_CHECK(it->second.children == 0, "remove of prefix node %llu with %u children", (unsigned long long)id,
              it->second.children);
  const Node n = it->second;
  leaves_.erase({n.tick, id});
  total_bytes_ -= n.bytes;
  nodes_.erase(it);
  if (n.parent != kNoParent) {
    Node& p = nodes_.at(n.parent);
    if (--p.children == 0) leaves_.insert({p.tick, n.parent});
  }
}

bool PrefixLru::is_leaf(NodeId id) const { return nodes_.at(id).children == 0; }
PrefixLru::NodeId PrefixLru::parent(NodeId id) const { return nodes_.at(id).parent; }
uint64_t PrefixLru::tick(NodeId id) const { return nodes_.at(id).tick; }
uint64_t PrefixLru::bytes(NodeId id) const { return nodes_.at(id).bytes; }

std::optional<PrefixLru::NodeId> PrefixLru::victim(const std::function<bool(NodeId)>& evictable) const {
  for (const auto& [tick, id] : leaves_) {
    if (!evictable || evictable(id)) return id;
  }
  return std::nullopt;
}

std::vector<PrefixLru::NodeId> PrefixLru::nodes() const {
  std::vector<NodeId> out;
  out.reserve(nodes_.size());
  for (const auto& [id, n] : nodes_) out.push_back(id);
  return out;
}

}  // namespace cedar::kv
