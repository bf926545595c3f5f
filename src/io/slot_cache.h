// SlotCache: the residency component for streamed weights. It owns
//   * the slab: n_slots slots of slot_bytes, allocated once (2 MiB-aligned anonymous memory with
//     MADV_HUGEPAGE where the kernel offers transparent huge pages), never resized;
//   * the policy: which key lives in which slot, and which slot to evict on a miss. Eviction is
//     GCLOCK (a clock hand over per-slot reference counters saturating at kMaxRef): a hit raises the
//     counter, the hand lowers it, a slot whose counter reached 0 is evicted; keys enter at 0 (at 1 when
//     prefetched, so a guess survives until it is used). That ranks by routing
//     frequency (often-used keys hold higher counters) and recency (counters decay as the hand
//     passes) in O(1) amortised per miss, for slabs of tens of slots (experts) or millions (rows);
//   * the prefetch queue: fetch(key, kPrefetch) starts reads without holding the slot, so a
//     look-ahead guess that turns out wrong costs a slot that the clock soon reclaims.
// The bytes come from a BlockReader; what to read for a key is the SlotFiller's business, so this
// class knows nothing about experts or Engram rows.
//
// Pins: fetch(key, kHold) holds the slot until release(); held slots and slots whose reads are in
// flight are never evicted. A read error is sticky (error()); the slot's bytes are then zeros, and
// the caller reports the error once its step ends.
//
// Single-threaded (the forward pass's thread); nothing allocates after create().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/block_reader.h"

namespace cedar::io {

// Describes a key's bytes: appends at most `max` reads whose destinations lie in `slot` (slot_bytes,
// aligned to slot_align) and returns how many.
class SlotFiller {
 public:
  virtual ~SlotFiller() = default;
  virtual size_t describe(uint64_t key, uint8_t* slot, ReadRequest* out, size_t max) = 0;
};

struct SlotCacheOptions {
  size_t slot_bytes = 0;   // rounded up to slot_align
  size_t slot_align = kDirectIoAlignment;  // O_DIRECT destinations need 4096; buffered reads less
  size_t n_slots = 0;
  bool huge_pages = true;
  std::string label = "cache";  // names the cache in errors
};

struct SlotCacheStats {
  uint64_t hits = 0;            // demand fetches whose key was resident or already in flight
  uint64_t misses = 0;          // demand fetches that had to start reads
  uint64_t prefetches = 0;      // prefetch fetches that started reads
  uint64_t prefetch_used = 0;   // prefetched keys later fetched on demand before eviction
  uint64_t evictions = 0;
  uint64_t bytes_read = 0;
};

class SlotCache {
 public:
  enum class Mode { kHold, kPrefetch };
  static constexpr int kNoSlot = -1;
  static constexpr uint8_t kMaxRef = 3;
  static constexpr size_t kMaxReadsPerKey = 128;

  // Errors: InvalidArgument for zero slots, ResourceExhausted when the slab cannot be allocated.
  static Result<std::unique_ptr<SlotCache>> create(BlockReader* reader, SlotFiller* filler,
                                                   const SlotCacheOptions& options);
  ~SlotCache();
  SlotCache(const SlotCache&) = delete;
  SlotCache& operator=(const SlotCache&) = delete;

  // The slot of `key`, starting its reads on a miss. kHold pins the slot (release() unpins); kPrefetch
  // does not and counts as a prefetch. Returns kNoSlot when every slot is held, or for a prefetch
  // also when every other slot is loading (a prefetch never waits); kHold callers never hold more
  // than n_slots() keys at once.
  int fetch(uint64_t key, Mode mode);
  // Waits until the slot's reads finished; returns its bytes.
  const uint8_t* wait(int slot);
  // Waits for every read in flight.
  void wait_all();
  void release(int slot);
  bool resident(uint64_t key) const;  // present (loaded or loading)

  size_t n_slots() const { return slots_.size(); }
  size_t slot_bytes() const { return slot_bytes_; }
  const SlotCacheStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  const Status& error() const { return error_; }
  BlockReader& reader() { return *reader_; }

 private:
  struct Slot {
    uint64_t key = 0;
    uint32_t pending = 0;   // reads in flight
    uint16_t holds = 0;
    uint8_t ref = 0;
    bool used = false;
    bool prefetched = false;  // loaded by a prefetch and not yet fetched on demand
  };
  SlotCache() = default;
  int find(uint64_t key) const;
  void map_insert(uint64_t key, int slot);
  void map_erase(uint64_t key);
  int pick_victim();
  void process(std::span<const ReadCompletion> done);
  uint8_t* slot_data(int s) { return slab_ + static_cast<size_t>(s) * slot_bytes_; }

  BlockReader* reader_ = nullptr;
  SlotFiller* filler_ = nullptr;
  std::string label_;
  size_t slot_bytes_ = 0;
  uint8_t* slab_ = nullptr;
  size_t slab_len_ = 0;
  std::vector<Slot> slots_;
  size_t hand_ = 0;
  // Open addressing with linear probing, backward-shift deletion: key -> slot, kEmpty when unused.
  std::vector<uint64_t> map_keys_;
  std::vector<int32_t> map_slots_;
  size_t map_mask_ = 0;
  std::vector<ReadRequest> reqs_;
  std::vector<ReadCompletion> done_;
  SlotCacheStats stats_;
  Status error_;
};

}  // namespace cedar::io
