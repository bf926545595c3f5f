// PrefixStore: the engine's prefix cache, over the engine's one KV home (a kv::KvCache whose pool holds
// the running sequences' global KV and the cached prefixes alike). When a request ends, its whole
// blocks of global KV (compressed main KV + index keys, never the SWA windows) join the prefix index
// where they are (content-addressed by the token chain) and are persisted to disk; the partial last
// block of the prompt and of the whole sequence go to the tail cache (kv/tail_cache.h). A new request
// attaches the longest cached prefix (whole blocks: a reference count each, no copy; then the longest
// tail after them) and rebuilds the windows and the pending compressor groups by bounded replay
// (spec §8) or, with ReplayMode::kFull, recomputes everything.
// With a shared tier (kv/redis_tier.h) a local miss asks it for the blocks and the tail after the local
// prefix, and every save also goes to it, asynchronously: the third level after memory and disk.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "core/status.h"
#include "kv/disk_cache.h"
#include "kv/kv_cache.h"
#include "kv/redis_tier.h"
#include "kv/tail_cache.h"
#include "model/model.h"
#include "runtime/prefix_levels.h"

namespace cedar::runtime {

enum class ReplayMode {
  kBounded,  // restore global KV, replay the last window_size cached tokens (approximate, spec §8)
  kFull,     // recompute the whole prompt with a cold prefill (exact; the cache only saves nothing)
};

struct PrefixStoreOptions {
  std::string disk_dir;                   // empty: memory only
  uint64_t disk_budget_bytes = 8ull << 30;
  uint32_t block_tokens = 64;             // a multiple of every compress ratio
  uint32_t memory_blocks = 4096;          // blocks for cached prefixes in memory
  uint32_t live_blocks = 0;               // blocks for the running sequences, beside them
  kv::RedisTierOptions tier;              // tier.url empty: no shared tier
};

struct ResumePlan {
  int64_t cached_tokens = 0;   // prompt tokens whose global KV was restored
  int64_t replay_from = 0;     // first position the forward pass runs (0: cold prefill)
  int64_t replayed_tokens() const { return cached_tokens - replay_from; }
};

class PrefixStore {
 public:
  static Result<std::unique_ptr<PrefixStore>> create(const model::Model& model, const PrefixStoreOptions& options);
  ~PrefixStore();

  // The KV home: sequences the store restores into and saves from are made in it (Model::new_sequence).
  kv::KvCache& cache() { return *cache_; }

  // Fills a fresh `seq` from the longest cached prefix of `prompt` (whole blocks and a tail, leaving
  // at least one prompt token to run) and prepares it for the replay mode. After this, feed
  // prompt[replay_from:]. images: the prompt's image spans, or null: their positions are looked up by
  // the images' key ids (model::image_key_id), so only the same image at the same place hits, and a
  // replay never starts inside a span.
  Result<ResumePlan> restore(std::span<const int32_t> prompt, ReplayMode mode, model::SequenceState& seq,
                             const model::SequenceImages* images = nullptr);
  // Stores `seq` (its tokens and global KV): whole blocks in memory and on disk, and as tails the
  // prefix [0, prompt_tokens) (the request's prompt, which the next turn usually repeats even when it
  // re-renders the answer differently) and the whole sequence.
  // The blocks stay where they are: this indexes them (and writes the disk and the tier).
  Status save(model::SequenceState& seq, int64_t prompt_tokens);

  kv::KvCacheStats memory_stats() const;
  uint64_t block_bytes() const { return geometry_.block_bytes; }
  kv::DiskCacheStats disk_stats() const;
  kv::TailCacheStats tail_stats() const;
  PrefixLevelStats level_stats() const;
  kv::RedisTier* tier() { return tier_.get(); }

 private:
  PrefixStore(const model::Model& m) : model_(m) {}
  const model::Model& model_;
  kv::CacheGeometry geometry_;
  std::unique_ptr<kv::DiskPrefixCache> disk_;
  std::unique_ptr<kv::KvCache> cache_;
  std::unique_ptr<kv::TailCache> tails_;
  Status save_tail(const model::SequenceState& seq, int64_t end);
  // The tail of [0, end) after its last whole block: its first token and its payload (TailCache layout).
  int64_t tail_payload(const model::SequenceState& seq, int64_t end, std::vector<uint8_t>* payload) const;
  // Blocks from `first` on of `prompt` from the shared tier, written straight into `seq`, and the
  // tier's tail where they end (into *tail), restoring at most max_tokens tokens: one round trip.
  kv::RedisTier::Found restore_from_tier(std::span<const int32_t> prompt, size_t first, int64_t max_tokens,
                                         model::SequenceState& seq, std::vector<uint8_t>* tail);
  void save_to_tier(const kv::Sequence* ks, const model::SequenceState& seq, int64_t prompt_tokens);
  std::unique_ptr<kv::RedisTier> tier_;
  // Level counters; restore() runs on one thread at a time (the engine's scheduler), stats read them.
  mutable std::mutex levels_mu_;
  PrefixLevelStats levels_;
};

}  // namespace cedar::runtime
