// Eviction policy (PrefixLru): invariants and the no-starvation guarantee, as property tests over random
// workloads, with the expectations computed by brute force from the workload's history.
#include "kv/prefix_lru.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

namespace cedar::kv {
namespace {

using NodeId = PrefixLru::NodeId;

// A prefix is a path of block keys; a block key names (prefix so far), so equal paths share blocks.
using Prefix = std::vector<int>;

// The save/use protocol of the prefix caches, on top of PrefixLru with a budget in blocks.
class SimCache {
 public:
  explicit SimCache(uint64_t budget) : budget_(budget) {}

  // Stores the prefix (as DiskPrefixCache::save does): existing blocks are reused, new ones need room;
  // the chain being saved is never evicted for itself. Returns the blocks touched.
  std::vector<NodeId> save(const Prefix& p) {
    const uint64_t tick = ++clock_;
    std::vector<NodeId> chain;
    NodeId parent = PrefixLru::kNoParent;
    for (size_t k = 0; k < p.size(); ++k) {
      const NodeId id = key_of(p, k + 1);
      if (!lru_.contains(id)) {
        if (!make_room(chain)) break;
        lru_.add(id, parent, 1, tick);
      }
      chain.push_back(id);
      parent = id;
    }
    if (!chain.empty()) lru_.touch_path(chain.back(), tick);
    return chain;
  }
  // A lookup: the longest stored part of the prefix is used. Returns the blocks touched.
  std::vector<NodeId> use(const Prefix& p) {
    const uint64_t tick = ++clock_;
    std::vector<NodeId> chain;
    for (size_t k = 0; k < p.size() && lru_.contains(key_of(p, k + 1)); ++k) chain.push_back(key_of(p, k + 1));
    if (!chain.empty()) lru_.touch_path(chain.back(), tick);
    return chain;
  }
  size_t stored_blocks(const Prefix& p) const {
    size_t k = 0;
    while (k < p.size() && lru_.contains(key_of(p, k + 1))) ++k;
    return k;
  }
  NodeId key_of(const Prefix& p, size_t len) const {
    const Prefix head(p.begin(), p.begin() + static_cast<ptrdiff_t>(len));
    auto [it, inserted] = keys_.emplace(head, keys_.size() + 1);
    return it->second;
  }
  const PrefixLru& lru() const { return lru_; }
  uint64_t clock() const { return clock_; }

 private:
  bool make_room(const std::vector<NodeId>& chain) {
    while (lru_.total_bytes() + 1 > budget_) {
      const auto v = lru_.victim([&](NodeId id) { return std::find(chain.begin(), chain.end(), id) == chain.end(); });
      if (!v) return false;
      // The policy's choice must be the oldest evictable leaf (brute force over all nodes).
      uint64_t oldest = UINT64_MAX;
      for (NodeId n : lru_.nodes())
        if (lru_.is_leaf(n) && std::find(chain.begin(), chain.end(), n) == chain.end())
          oldest = std::min(oldest, lru_.tick(n));
      EXPECT_EQ(lru_.tick(*v), oldest);
      EXPECT_TRUE(lru_.is_leaf(*v));
      lru_.remove(*v);
    }
    return true;
  }

  uint64_t budget_;
  PrefixLru lru_;
  uint64_t clock_ = 0;
  mutable std::map<Prefix, NodeId> keys_;
};

void check_structure(const PrefixLru& lru, uint64_t budget) {
  ASSERT_LE(lru.total_bytes(), budget);
  for (NodeId n : lru.nodes()) {
    const NodeId p = lru.parent(n);
    if (p == PrefixLru::kNoParent) continue;
    ASSERT_TRUE(lru.contains(p)) << "orphan " << n;                 // never strands a block
    ASSERT_GE(lru.tick(p), lru.tick(n)) << "ancestor older than descendant";
    ASSERT_FALSE(lru.is_leaf(p));
  }
}

// Random prefixes with heavy sharing and lengths from 1 to max_len blocks.
Prefix random_prefix(std::mt19937& rng, std::vector<Prefix>& seen, int max_len) {
  std::uniform_int_distribution<int> coin(0, 3);
  if (!seen.empty() && coin(rng) != 0) {
    Prefix p = seen[std::uniform_int_distribution<size_t>(0, seen.size() - 1)(rng)];
    const int op = coin(rng);
    if (op == 0 && p.size() > 1) p.resize(std::uniform_int_distribution<size_t>(1, p.size())(rng));  // a shorter one
    if (op == 1) {  // branch off
      p.resize(std::uniform_int_distribution<size_t>(0, p.size() - 1)(rng));
      const int extra = std::uniform_int_distribution<int>(1, max_len)(rng);
      for (int i = 0; i < extra && static_cast<int>(p.size()) < max_len; ++i) p.push_back(rng() % 5);
    }
    return p;
  }
  Prefix p(std::uniform_int_distribution<int>(1, max_len)(rng));
  for (int& b : p) b = static_cast<int>(rng() % 5);
  return p;
}

// The guarantee: a prefix P stays complete while the distinct blocks touched at or after P's last
// complete use fit in the budget -- whatever P's length.
TEST(PrefixLru, NoStarvationProperty) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    const uint64_t budget = 4 + seed % 13;
    const int max_len = static_cast<int>(budget) + 2;  // some prefixes do not fit at all
    SimCache cache(budget);
    std::vector<Prefix> seen;
    struct Use {
      uint64_t tick;
      std::vector<NodeId> blocks;
    };
    std::vector<Use> history;
    std::map<Prefix, uint64_t> last_complete;  // prefix -> tick of its last complete save/use
    for (int step = 0; step < 400; ++step) {
      const Prefix p = random_prefix(rng, seen, max_len);
      seen.push_back(p);
      const bool save = rng() % 2 == 0;
      std::vector<NodeId> touched = save ? cache.save(p) : cache.use(p);
      history.push_back({cache.clock(), touched});
      if (touched.size() == p.size()) last_complete[p] = cache.clock();
      check_structure(cache.lru(), budget);
      if (::testing::Test::HasFatalFailure()) return;
      // distinct_since[i] = distinct blocks touched by operations i..now (one tick per operation).
      std::vector<size_t> distinct_since(history.size());
      std::set<NodeId> since;
      for (size_t i = history.size(); i-- > 0;) {
        since.insert(history[i].blocks.begin(), history[i].blocks.end());
        distinct_since[i] = since.size();
      }
      for (const auto& [q, t] : last_complete) {
        const size_t used_since = distinct_since[t - history.front().tick];
        if (used_since <= budget) {
          ASSERT_EQ(cache.stored_blocks(q), q.size())
              << "seed " << seed << " step " << step << ": a prefix of " << q.size() << " blocks was cut although only "
              << used_since << " blocks were used since its last use (budget " << budget << ")";
        }
      }
    }
  }
}

TEST(PrefixLru, LongPrefixOutlivesOlderShortOnesAndIsTrimmedFromItsEnd) {
  SimCache cache(10);
  const Prefix short_a = {1, 1}, short_b = {2, 2};
  const Prefix long_p = {3, 3, 3, 3, 3, 3, 3, 3};  // 8 blocks
  cache.save(short_a);
  cache.save(long_p);  // needs room: evicts the older short prefix, not its own blocks
  EXPECT_EQ(cache.stored_blocks(long_p), 8u);
  EXPECT_EQ(cache.stored_blocks(short_a), 2u);
  cache.save(short_b);  // 12 > 10: the oldest leaves are short_a's
  EXPECT_EQ(cache.stored_blocks(short_a), 0u);
  EXPECT_EQ(cache.stored_blocks(long_p), 8u);
  EXPECT_EQ(cache.stored_blocks(short_b), 2u);
  cache.save({4, 4, 4});  // now the long prefix is the oldest: trimmed from its end
  EXPECT_EQ(cache.stored_blocks(long_p), 5u);
  EXPECT_EQ(cache.stored_blocks(short_b), 2u);
}

TEST(PrefixLru, SaveLongerThanBudgetKeepsItsLeadingBlocks) {
  SimCache cache(5);
  const Prefix p = {9, 9, 9, 9, 9, 9, 9};
  EXPECT_EQ(cache.save(p).size(), 5u);
  EXPECT_EQ(cache.stored_blocks(p), 5u);
}

TEST(PrefixLru, SharedAncestorStaysWhileAnyBranchIsRecent) {
  PrefixLru lru;
  lru.add(1, PrefixLru::kNoParent, 1, 1);
  lru.add(2, 1, 1, 2);  // branch A
  lru.add(3, 1, 1, 3);  // branch B
  EXPECT_EQ(lru.tick(1), 3u);
  EXPECT_EQ(*lru.victim(), 2u);  // root is not a leaf
  lru.remove(2);
  EXPECT_EQ(*lru.victim(), 3u);
  lru.touch_path(3, 10);
  EXPECT_EQ(lru.tick(1), 10u);
  EXPECT_EQ(lru.total_bytes(), 2u);
  EXPECT_FALSE(lru.victim([](NodeId) { return false; }).has_value());
}

TEST(PrefixLruDeathTest, RemovingANodeWithChildrenIsABug) {
  PrefixLru lru;
  lru.add(1, PrefixLru::kNoParent, 1, 1);
  lru.add(2, 1, 1, 2);
  EXPECT_DEATH(lru.remove(1), "children");
}

}  // namespace
}  // namespace cedar::kv
