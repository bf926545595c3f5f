#include "io/slot_cache.h"

#include <sys/mman.h>

#include <cstring>

#include "core/check.h"
#include "core/huge_pages.h"

namespace cedar::io {
namespace {

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

uint64_t mix(uint64_t k) {  // splitmix64 finaliser: expert keys and row ids are far from uniform
  k ^= k >> 30;
  k *= 0xBF58476D1CE4E5B9ull;
  k ^= k >> 27;
  k *= 0x94D049BB133111EBull;
  return k ^ (k >> 31);
}

}  // namespace

Result<std::unique_ptr<SlotCache>> SlotCache::create(BlockReader* reader, SlotFiller* filler,
                                                     const SlotCacheOptions& options) {
  if (options.n_slots == 0 || options.slot_bytes == 0)
    return invalid_argument(options.label + ": a streaming cache needs at least one slot");
  std::unique_ptr<SlotCache> c(new SlotCache());
  c->reader_ = reader;
  c->filler_ = filler;
  c->label_ = options.label;
  if (options.slot_align == 0 || (options.slot_align & (options.slot_align - 1)))
    return invalid_argument(options.label + ": slot alignment must be a power of two");
  c->slot_bytes_ = round_up(options.slot_bytes, options.slot_align);
  c->slab_len_ = round_up(c->slot_bytes_ * options.n_slots, kHugePageBytes);
  // Over-map by one huge page so the slab can start on a 2 MiB boundary (THP needs that).
  void* p = ::mmap(nullptr, c->slab_len_ + kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return resource_exhausted(options.label + ": cannot allocate a " + std::to_string(c->slab_len_ >> 20) +
                              " MiB slab; lower --memory-budget");
  uint8_t* base = static_cast<uint8_t*>(p);
  uint8_t* aligned = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(base), kHugePageBytes));
  if (aligned > base) ::munmap(base, aligned - base);
  const size_t tail = (base + c->slab_len_ + kHugePageBytes) - (aligned + c->slab_len_);
  if (tail) ::munmap(aligned + c->slab_len_, tail);
  c->slab_ = aligned;
  if (options.huge_pages) (void)::madvise(c->slab_, c->slab_len_, MADV_HUGEPAGE);  // refused: 4 KiB pages
  c->slots_.resize(options.n_slots);
  size_t cap = 16;
  while (cap < 2 * options.n_slots) cap <<= 1;
  c->map_keys_.assign(cap, 0);
  c->map_slots_.assign(cap, kNoSlot);
  c->map_mask_ = cap - 1;
  c->reqs_.resize(kMaxReadsPerKey);
  c->done_.resize(256);
  return c;
}

SlotCache::~SlotCache() {
  // Reads in flight target the slab: let them land before unmapping it.
  if (reader_) {
    while (reader_->outstanding() > 0)
      if (reader_->reap(done_, true) == 0 && reader_->outstanding() > 0) continue;
  }
  if (slab_) ::munmap(slab_, slab_len_);
}

int SlotCache::find(uint64_t key) const {
  for (size_t i = mix(key) & map_mask_;; i = (i + 1) & map_mask_) {
    if (map_slots_[i] == kNoSlot) return kNoSlot;
    if (map_keys_[i] == key) return map_slots_[i];
  }
}

void SlotCache::map_insert(uint64_t key, int slot) {
  size_t i = mix(key) & map_mask_;
  while (map_slots_[i] != kNoSlot) i = (i + 1) & map_mask_;
  map_keys_[i] = key;
  map_slots_[i] = slot;
}

void SlotCache::map_erase(uint64_t key) {
  size_t i = mix(key) & map_mask_;
  while (map_keys_[i] != key || map_slots_[i] == kNoSlot) {
    CEDAR_CHECK(map_slots_[i] != kNoSlot, "slot map lost a key");
    i = (i + 1) & map_mask_;
  }
  // Backward-shift deletion keeps every probe chain unbroken without tombstones.
  for (size_t j = (i + 1) & map_mask_;; j = (j + 1) & map_mask_) {
    if (map_slots_[j] == kNoSlot) break;
    const size_t home = mix(map_keys_[j]) & map_mask_;
    // Entry j may move to i when its home is not in (i, j] (cyclically).
    const bool between = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!between) {
      map_keys_[i] = map_keys_[j];
      map_slots_[i] = map_slots_[j];
      i = j;
    }
  }
  map_slots_[i] = kNoSlot;
}

bool SlotCache::resident(uint64_t key) const { return find(key) != kNoSlot; }

int SlotCache::pick_victim() {
  const size_t n = slots_.size();
  // kMaxRef + 1 sweeps bring every unpinned counter to 0; a further sweep finds it.
  for (size_t step = 0; step < n * (kMaxRef + 2); ++step) {
    Slot& s = slots_[hand_];
    const int i = static_cast<int>(hand_);
    hand_ = hand_ + 1 == n ? 0 : hand_ + 1;
    if (!s.used) return i;
    if (s.holds > 0 || s.pending > 0) continue;
    if (s.ref > 0) {
      --s.ref;
      continue;
    }
    return i;
  }
  return kNoSlot;
}

int SlotCache::fetch(uint64_t key, Mode mode) {
  int s = find(key);
  if (s != kNoSlot) {
    Slot& slot = slots_[s];
    if (mode == Mode::kHold) {
      ++stats_.hits;
      ++slot.holds;
      if (slot.prefetched) {
        ++stats_.prefetch_used;
        slot.prefetched = false;
      }
    }
    if (slot.ref < kMaxRef) ++slot.ref;
    return s;
  }
  s = pick_victim();
  while (s == kNoSlot) {
    // Every slot is held or loading. A prefetch is optional: it gives up rather than wait. A demand
    // fetch waits for loading slots to land (one becomes evictable once its reads are done).
    if (mode == Mode::kPrefetch || reader_->outstanding() == 0) return kNoSlot;
    process({done_.data(), reader_->reap(done_, true)});
    s = pick_victim();
  }
  Slot& slot = slots_[s];
  if (slot.used) {
    map_erase(slot.key);
    ++stats_.evictions;
  }
  slot.key = key;
  slot.used = true;
  // A key read on demand starts at 0, so one-off keys (a long prompt's rare experts) leave first and
  // do not push out the often-used ones; a prefetched key starts at 1 so that it survives until used.
  slot.ref = mode == Mode::kPrefetch ? 1 : 0;
  slot.holds = mode == Mode::kHold ? 1 : 0;
  slot.prefetched = mode == Mode::kPrefetch;
  map_insert(key, s);
  if (mode == Mode::kHold) ++stats_.misses;
  else ++stats_.prefetches;
  const size_t n = filler_->describe(key, slot_data(s), reqs_.data(), reqs_.size());
  slot.pending = static_cast<uint32_t>(n);
  for (size_t i = 0; i < n; ++i) {
    reqs_[i].tag = static_cast<uint64_t>(s);
    reader_->submit(reqs_[i]);
  }
  // Start them now (the caller computes while they run).
  process({done_.data(), reader_->reap(done_, false)});
  return s;
}

void SlotCache::process(std::span<const ReadCompletion> done) {
  for (const ReadCompletion& c : done) {
    Slot& slot = slots_[c.tag];
    CEDAR_CHECK(slot.pending > 0, "%s: completion for an idle slot", label_.c_str());
    --slot.pending;
    stats_.bytes_read += c.bytes;
    if (c.error && error_.ok()) {
      error_ = io_error(label_ + ": reading " + reader_->path(c.file) + " at offset " + std::to_string(c.offset) +
                            " failed; check the disk and the checkpoint file (cedar check-shards)",
                        c.error);
      std::memset(slot_data(static_cast<int>(c.tag)), 0, slot_bytes_);
    }
  }
}

const uint8_t* SlotCache::wait(int s) {
  while (slots_[s].pending > 0) process({done_.data(), reader_->reap(done_, true)});
  return slot_data(s);
}

void SlotCache::wait_all() {
  while (reader_->outstanding() > 0) process({done_.data(), reader_->reap(done_, true)});
}

void SlotCache::release(int s) {
  CEDAR_CHECK(s >= 0 && static_cast<size_t>(s) < slots_.size() && slots_[s].holds > 0, "%s: release of an unheld slot",
              label_.c_str());
  --slots_[s].holds;
}

}  // namespace cedar::io
