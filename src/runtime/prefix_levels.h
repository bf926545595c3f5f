// Prefix-cache hits by level: memory (the block pool and in-memory tails), the local disk cache, and
// the shared tier (Redis, kv/redis_tier.h), for /metrics.
#pragma once

#include <cstdint>

#include "kv/redis_tier.h"

namespace cedar::runtime {

struct PrefixLevelStats {
  // Lookups that restored a prefix, by the deepest level that served part of it (a prefix can come
  // from memory for its first blocks, then disk, then the shared tier).
  uint64_t hits_memory = 0, hits_disk = 0, hits_tier = 0;
  // Restored prompt tokens by the level they came from (whole blocks and tails).
  uint64_t tokens_memory = 0, tokens_disk = 0, tokens_tier = 0;
  kv::RedisTierStats tier;  // tier.configured is false without --kv-tier
};

}  // namespace cedar::runtime
