#include "runtime/prefix_store.h"

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "kv/prefix_index.h"
#include "kv/tier_record.h"

namespace cedar::runtime {

PrefixStore::~PrefixStore() {
  cache_.reset();  // before the disk cache it points to
  disk_.reset();
}

Result<std::unique_ptr<PrefixStore>> PrefixStore::create(const model::Model& model, const PrefixStoreOptions& o) {
  if (model.options().kv_dtype != model::KvDtype::kReference)
    return invalid_argument("the prefix cache stores the reference KV format (FP4/FP8); the bf16 KV is an "
                            "experiment of `cedar eval` without a prefix cache");
  std::unique_ptr<PrefixStore> ps(new PrefixStore(model));
  CEDAR_ASSIGN_OR_RETURN(ps->geometry_, model.kv_geometry(o.block_tokens));
  if (!o.disk_dir.empty()) {
    kv::DiskCacheOptions dopt;
    dopt.budget_bytes = o.disk_budget_bytes;
    auto disk = kv::DiskPrefixCache::open(o.disk_dir, ps->geometry_, dopt);
    if (disk.ok()) ps->disk_ = std::move(*disk);
    else CEDAR_LOG_WARN("prefix cache: no disk persistence (%s)", disk.status().to_string().c_str());
  }
  kv::KvCacheOptions copt;
  // One pool for the running sequences and the cached prefixes (index-only blocks are evicted first).
  const uint64_t blocks = uint64_t{o.memory_blocks} + o.live_blocks;
  if (blocks >= kv::kNoBlock) return invalid_argument("prefix cache: more than 2^32 KV blocks; raise --kv-block-tokens");
  copt.capacity_blocks = static_cast<uint32_t>(blocks);
  copt.disk = ps->disk_.get();
  CEDAR_ASSIGN_OR_RETURN(ps->cache_, kv::KvCache::create(ps->geometry_, copt));
  // Tails live next to the block files (the block cache's lock covers them); memory only without.
  kv::TailCacheOptions topt;
  if (ps->disk_) topt.dir = o.disk_dir + "/tails";
  auto tails = kv::TailCache::open(ps->geometry_, topt);
  if (!tails.ok() && !topt.dir.empty()) {
    CEDAR_LOG_WARN("prefix cache: tails kept in memory only (%s)", tails.status().to_string().c_str());
    tails = kv::TailCache::open(ps->geometry_, {});
  }
  CEDAR_RETURN_IF_ERROR(tails.status());
  ps->tails_ = std::move(*tails);
  if (!o.tier.url.empty()) { CEDAR_ASSIGN_OR_RETURN(ps->tier_, kv::RedisTier::open(o.tier, ps->geometry_)); }
  return ps;
}

Result<ResumePlan> PrefixStore::restore(std::span<const int32_t> ids, ReplayMode mode, model::SequenceState& seq,
                                        const model::SequenceImages* images) {
  ResumePlan plan;
  if (mode == ReplayMode::kFull || ids.size() < 2) return plan;
  // What the cache is keyed by: the ids, with image positions replaced by their key ids.
  std::vector<int32_t> keyed;
  std::span<const int32_t> prompt = ids;
  if (images && !images->empty()) {
    keyed.assign(ids.begin(), ids.end());
    model::key_image_positions(*images, 0, keyed);
    prompt = keyed;
  }
  if (&seq.home() != cache_.get()) return invalid_argument("prefix cache: the sequence lives in another KV cache");
  kv::Sequence& ks = seq.kv();
  const uint64_t reused_disk_before = cache_->stats().reused_tokens_disk;
  const uint64_t tail_disk_before = tails_->stats().hits_disk;
  // Whole blocks from memory (the sequence shares them: a reference count, no copy) or disk.
  CEDAR_ASSIGN_OR_RETURN(const int64_t local_full, cache_->attach_prefix(ks, prompt, static_cast<int64_t>(prompt.size()) - 1));
  const int64_t bt = geometry_.block_tokens;
  const int64_t max_tokens = static_cast<int64_t>(prompt.size()) - 1;
  // The longest tail after the whole blocks (still leaving one prompt token to run), local first.
  std::vector<uint8_t> tail;  // [TailCache::payload_bytes(n_tail)]
  int64_t n_tail = tails_->lookup(prompt, local_full, max_tokens - local_full, &tail);
  // On a local miss, the shared tier in one round trip: its blocks after the local prefix and the
  // tail where they end (not asked when the local cache has every whole block and a tail).
  kv::RedisTier::Found from_tier;
  std::vector<uint8_t> tier_tail;
  if (tier_ && (local_full / bt < max_tokens / bt || n_tail == 0))
    from_tier = restore_from_tier(prompt, static_cast<size_t>(local_full / bt), max_tokens, seq, &tier_tail);
  const int64_t full = local_full + static_cast<int64_t>(from_tier.blocks) * bt;
  if (from_tier.blocks > 0) n_tail = tails_->lookup(prompt, full, max_tokens - full, &tail);  // after the tier's
  const bool tail_from_tier = from_tier.tail_tokens > n_tail;
  if (tail_from_tier) {
    tail.swap(tier_tail);
    n_tail = from_tier.tail_tokens;
  }
  const int64_t cached = full + n_tail;
  const int64_t window = model_.config().window_size;
  // A prefix no longer than the window is replayed whole: that is a cold prefill.
  if (cached <= window) {
    CEDAR_RETURN_IF_ERROR(cache_->truncate(ks, 0));
    return plan;
  }
  {
    // Which level served what (the cache counters moved by this lookup alone: one caller at a time).
    const kv::KvCacheStats after = cache_->stats();
    const kv::TailCacheStats tails_after = tails_->stats();
    std::lock_guard<std::mutex> lock(levels_mu_);
    const uint64_t from_disk = after.reused_tokens_disk - reused_disk_before;
    const uint64_t from_memory = static_cast<uint64_t>(local_full) - from_disk;
    const bool tail_disk = !tail_from_tier && tails_after.hits_disk > tail_disk_before;
    const uint64_t tier_tokens = from_tier.blocks * bt + (tail_from_tier ? n_tail : 0);
    levels_.tokens_memory += from_memory + (!tail_from_tier && !tail_disk ? n_tail : 0);
    levels_.tokens_disk += from_disk + (tail_disk ? n_tail : 0);
    levels_.tokens_tier += tier_tokens;
    if (tier_tokens)
      ++levels_.hits_tier;
    else if (from_disk || tail_disk)
      ++levels_.hits_disk;
    else
      ++levels_.hits_memory;
  }
  if (n_tail > 0) {
    // The tail's entries go to a block of the sequence's own (it starts at a block boundary).
    CEDAR_RETURN_IF_ERROR(cache_->append(ks, prompt.subspan(static_cast<size_t>(full), static_cast<size_t>(n_tail))));
    for (size_t o = 0; o < geometry_.owners.size(); ++o) {
      const kv::OwnerGeometry& og = geometry_.owners[o];
      const int64_t tail_entries = n_tail / og.ratio, first = full / og.ratio;
      if (tail_entries == 0) continue;
      const int oi = static_cast<int>(o);
      std::memcpy(ks.main_entry_mut(oi, first), tail.data() + kv::TailCache::main_offset(geometry_, n_tail, oi),
                  tail_entries * og.main_entry_bytes);
      if (og.index_entry_bytes)
        std::memcpy(ks.index_key_mut(oi, first), tail.data() + kv::TailCache::index_offset(geometry_, n_tail, oi),
                    tail_entries * og.index_entry_bytes);
    }
  }
  plan.cached_tokens = cached;
  // Replay one window, and at least every group still pending at `cached` (its compressor state is
  // rebuilt from the replayed tokens).
  plan.replay_from = cached - window;
  for (const kv::OwnerGeometry& og : geometry_.owners)
    plan.replay_from = std::min(plan.replay_from, cached / og.ratio * og.ratio);
  // The reference prefills an image span in one chunk: a replay starting inside one starts at it.
  if (images)
    if (const int span = images->span_at(plan.replay_from); span >= 0) plan.replay_from = images->spans[span].start;
  if (plan.replay_from <= 0) {
    CEDAR_RETURN_IF_ERROR(cache_->truncate(ks, 0));
    return ResumePlan{};
  }
  CEDAR_RETURN_IF_ERROR(model_.prepare_resume(seq, ids, plan.cached_tokens, plan.replay_from, images));
  return plan;
}

int64_t PrefixStore::tail_payload(const model::SequenceState& seq, int64_t end, std::vector<uint8_t>* out) const {
  const int64_t bt = geometry_.block_tokens;
  const int64_t start = end / bt * bt, n = end - start;
  std::vector<uint8_t>& payload = *out;
  payload.assign(kv::TailCache::payload_bytes(geometry_, n), 0);  // [payload_bytes(n)]
  // The tail lies in one block of the sequence, so each owner's entries of it are contiguous.
  const kv::Sequence& ks = seq.kv();
  for (size_t o = 0; o < geometry_.owners.size(); ++o) {
    const kv::OwnerGeometry& og = geometry_.owners[o];
    const int oi = static_cast<int>(o);
    const int64_t first = start / og.ratio, count = n / og.ratio;
    if (count == 0) continue;
    std::memcpy(payload.data() + kv::TailCache::main_offset(geometry_, n, oi), ks.main_entry(oi, first),
                count * og.main_entry_bytes);
    if (og.index_entry_bytes)
      std::memcpy(payload.data() + kv::TailCache::index_offset(geometry_, n, oi), ks.index_key(oi, first),
                  count * og.index_entry_bytes);
  }
  return start;
}

Status PrefixStore::save_tail(const model::SequenceState& seq, int64_t end) {
  const int64_t bt = geometry_.block_tokens;
  if (end % bt == 0 || end > seq.n_tokens) return {};
  std::vector<uint8_t> payload;
  const int64_t start = tail_payload(seq, end, &payload);
  return tails_->save(seq.tokens().first(static_cast<size_t>(end)), start, end, payload);
}

Status PrefixStore::save(model::SequenceState& seq, int64_t prompt_tokens) {
  if (&seq.home() != cache_.get()) return invalid_argument("prefix cache: the sequence lives in another KV cache");
  const int64_t bt = geometry_.block_tokens;
  kv::Sequence& ks = seq.kv();
  // Only processed positions are kept (a sequence cut short during a replay holds more ids).
  if (ks.n_tokens() > seq.n_tokens) CEDAR_RETURN_IF_ERROR(cache_->truncate(ks, seq.n_tokens));
  const int64_t n_full = (seq.n_tokens / bt) * bt;
  CEDAR_RETURN_IF_ERROR(save_tail(seq, std::min(prompt_tokens, seq.n_tokens)));
  if (prompt_tokens < seq.n_tokens) CEDAR_RETURN_IF_ERROR(save_tail(seq, seq.n_tokens));
  if (n_full == 0) {
    if (tier_) save_to_tier(nullptr, seq, prompt_tokens);
    return {};
  }
  // Boundary records of the blocks this sequence wrote (attached ones carry theirs): the Engram
  // history (compressed ids) as of each block's last token. Then the blocks themselves join the
  // index where they are: nothing is copied.
  auto hist = ks.engram_history();
  for (int64_t k = ks.reused_prefix_tokens() / bt; k < n_full / bt; ++k) {
    const int64_t end = (k + 1) * bt;
    for (size_t i = 0; i < hist.size(); ++i) {
      const int64_t pos = end - static_cast<int64_t>(hist.size()) + static_cast<int64_t>(i);
      hist[i] = pos >= 0 && pos < seq.engram.size() ? seq.engram.compressed[pos] : -1;
    }
    ks.capture_boundary_state(static_cast<size_t>(k));
  }
  Status st = cache_->commit(ks);
  if (st.ok() && tier_) save_to_tier(&ks, seq, prompt_tokens);
  return st;
}

kv::RedisTier::Found PrefixStore::restore_from_tier(std::span<const int32_t> prompt, size_t first, int64_t max_tokens,
                                                    model::SequenceState& seq, std::vector<uint8_t>* tail) {
  const uint32_t bt = geometry_.block_tokens;
  const size_t n = static_cast<size_t>(max_tokens / bt);
  kv::Sequence& ks = seq.kv();
  const std::vector<uint64_t> hashes =
      kv::chain_hashes(prompt, bt, n, kv::chain_root_hash(geometry_.layout_fingerprint()));
  return tier_->lookup(
      prompt, hashes, first, max_tokens,
      [&](size_t k, std::span<const uint8_t> boundary, std::span<const uint8_t> block) {
        // Blocks arrive in order right after the sequence's last one; each gets a block of its own.
        if (static_cast<size_t>(ks.n_tokens()) != k * bt || !cache_->append(ks, prompt.subspan(k * bt, bt)).ok())
          return false;
        // A block holds, owner after owner, its main entries then its index keys (kv/geometry.h).
        for (size_t o = 0; o < geometry_.owners.size(); ++o) {
          const kv::OwnerGeometry& og = geometry_.owners[o];
          const int oi = static_cast<int>(o);
          const int64_t first_entry = static_cast<int64_t>(k) * og.entries_per_block;
          std::memcpy(ks.main_entry_mut(oi, first_entry), block.data() + og.main_offset,
                      uint64_t{og.entries_per_block} * og.main_entry_bytes);
          if (og.index_entry_bytes)
            std::memcpy(ks.index_key_mut(oi, first_entry), block.data() + og.index_offset,
                        uint64_t{og.entries_per_block} * og.index_entry_bytes);
        }
        if (boundary.size() == geometry_.boundary_state_bytes)
          std::memcpy(ks.boundary_state_mut(k), boundary.data(), boundary.size());
        return true;
      },
      tail);
}

void PrefixStore::save_to_tier(const kv::Sequence* ks, const model::SequenceState& seq, int64_t prompt_tokens) {
  const uint32_t bt = geometry_.block_tokens;
  const uint64_t layout = geometry_.layout_fingerprint();
  const std::span<const int32_t> tokens = seq.tokens();
  const size_t n_blocks = ks ? static_cast<size_t>(ks->n_tokens() / bt) : 0;
  // The tails: the prompt's and the whole sequence's partial last blocks (as the local tail cache).
  std::vector<int64_t> tail_ends;
  for (const int64_t end : {std::min(prompt_tokens, seq.n_tokens), seq.n_tokens})
    if (end % bt != 0 && (tail_ends.empty() || tail_ends.back() != end)) tail_ends.push_back(end);
  std::vector<int64_t> ends;
  for (size_t k = 0; k < n_blocks; ++k) ends.push_back(static_cast<int64_t>((k + 1) * bt));
  for (const int64_t end : tail_ends) ends.insert(ends.end(), {end, end / bt * bt});  // a tail and its start
  std::sort(ends.begin(), ends.end());
  ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
  const std::vector<kv::PrefixDigest> digests = kv::prefix_digests(tokens, ends, layout);
  auto digest_at = [&](int64_t end) { return digests[std::lower_bound(ends.begin(), ends.end(), end) - ends.begin()]; };

  std::vector<kv::RedisTier::Record> records;
  std::vector<uint64_t> block_hashes;
  if (n_blocks > 0) {
    const std::vector<uint64_t> hashes = kv::chain_hashes(tokens, bt, n_blocks, kv::chain_root_hash(layout));
    for (size_t k = 0; k < n_blocks; ++k) {
      if (!tier_->wants_block(hashes[k])) continue;
      kv::TierRecordIdentity id;
      id.kind = kv::TierRecordKind::kBlock;
      id.chain_hash = hashes[k];
      id.digest = digest_at(static_cast<int64_t>((k + 1) * bt));
      id.start = static_cast<int64_t>(k * bt);
      id.tokens = tokens.subspan(k * bt, bt);
      const uint8_t* kv_bytes = cache_->pool().block_data(ks->block_table()[k]);
      records.push_back(
          {kv::tier_block_key(layout, hashes[k]),
           kv::encode_tier_record(geometry_, id, std::span(ks->boundary_state(k), geometry_.boundary_state_bytes),
                                  std::span(kv_bytes, geometry_.block_bytes))});
      block_hashes.push_back(hashes[k]);
    }
  }
  std::vector<uint8_t> payload;
  for (const int64_t end : tail_ends) {
    const int64_t start = tail_payload(seq, end, &payload);
    kv::TierRecordIdentity id;
    id.kind = kv::TierRecordKind::kTail;
    id.digest = digest_at(end);
    id.start = start;
    id.tokens = tokens.subspan(static_cast<size_t>(start), static_cast<size_t>(end - start));
    // Keyed by the prefix before the tail, field = its length: one lookup finds it (tier_record.h).
    records.push_back({kv::tier_tail_key(layout, digest_at(start)), kv::encode_tier_record(geometry_, id, {}, payload),
                       std::to_string(end - start)});
  }
  tier_->save_async(std::move(records), std::move(block_hashes));
}

kv::KvCacheStats PrefixStore::memory_stats() const { return cache_->stats(); }
kv::DiskCacheStats PrefixStore::disk_stats() const { return disk_ ? disk_->stats() : kv::DiskCacheStats{}; }
kv::TailCacheStats PrefixStore::tail_stats() const { return tails_->stats(); }

PrefixLevelStats PrefixStore::level_stats() const {
  PrefixLevelStats s;
  {
    std::lock_guard<std::mutex> lock(levels_mu_);
    s = levels_;
  }
  if (tier_) s.tier = tier_->stats();
  return s;
}

}  // namespace cedar::runtime
