#include "runtime/prefix_store.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/log.h"
#include "kv/prefix_index.h"
#include "kv/tier_record.h"
#include "runtime/kv_spec.h"

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
  std::ifstream in(model.dir() + "/config.json", std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const uint64_t fp = model_fingerprint(text.str(), model.checkpoint());
  const kv::ModelKvSpec spec = kv_spec_from_plan(model.dir(), model.config(), model.plan(), fp);
  CEDAR_ASSIGN_OR_RETURN(ps->geometry_, kv::make_cache_geometry(spec, o.block_tokens, model.config().n_layers));
  if (!o.disk_dir.empty()) {
    kv::DiskCacheOptions dopt;
    dopt.budget_bytes = o.disk_budget_bytes;
    auto disk = kv::DiskPrefixCache::open(o.disk_dir, ps->geometry_, dopt);
    if (disk.ok()) ps->disk_ = std::move(*disk);
    else CEDAR_LOG_WARN("prefix cache: no disk persistence (%s)", disk.status().to_string().c_str());
  }
  kv::KvCacheOptions copt;
  copt.capacity_blocks = o.memory_blocks;
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
  for (const kv::OwnerGeometry& og : ps->geometry_.owners) ps->owner_index_.push_back(og.layer);
  if (!o.tier.url.empty()) { CEDAR_ASSIGN_OR_RETURN(ps->tier_, kv::RedisTier::open(o.tier, ps->geometry_)); }
  return ps;
}

Result<ResumePlan> PrefixStore::restore(std::span<const int32_t> prompt, ReplayMode mode, model::SequenceState& seq) {
  ResumePlan plan;
  if (mode == ReplayMode::kFull || prompt.size() < 2) return plan;
  CEDAR_ASSIGN_OR_RETURN(kv::Sequence * ks, cache_->new_sequence());
  const uint64_t reused_disk_before = cache_->stats().reused_tokens_disk;
  const uint64_t tail_disk_before = tails_->stats().hits_disk;
  auto h = cache_->attach_prefix(*ks, prompt, static_cast<int64_t>(prompt.size()) - 1);
  if (!h.ok()) {
    cache_->release(ks);
    return h.status();
  }
  const int64_t local_full = *h;
  const int64_t bt = geometry_.block_tokens;
  const int64_t max_tokens = static_cast<int64_t>(prompt.size()) - 1;
  // On a local miss, the shared tier's blocks after the local prefix go straight into `seq` (the
  // cold-prefill path below rewrites them when the prefix turns out too short to use).
  const size_t tier_blocks =
      tier_ ? restore_from_tier(prompt, static_cast<size_t>(local_full / bt), static_cast<size_t>(max_tokens / bt), seq)
            : 0;
  const int64_t full = local_full + static_cast<int64_t>(tier_blocks) * bt;
  // The longest tail after the whole blocks (still leaving one prompt token to run): local, then shared.
  std::vector<uint8_t> tail;  // [TailCache::payload_bytes(n_tail)]
  int64_t n_tail = tails_->lookup(prompt, full, max_tokens - full, &tail);
  const bool tail_from_tier =
      n_tail == 0 && tier_ && (n_tail = tier_->fetch_tail(prompt, full, max_tokens - full, &tail)) > 0;
  const int64_t cached = full + n_tail;
  const int64_t window = model_.config().window_size;
  // A prefix no longer than the window is replayed whole: that is a cold prefill.
  if (cached <= window) {
    cache_->release(ks);
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
    const uint64_t tier_tokens = tier_blocks * bt + (tail_from_tier ? n_tail : 0);
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
  for (size_t o = 0; o < owner_index_.size(); ++o) {
    model::KvOwnerState& owner = seq.owner(owner_index_[o]);
    const kv::OwnerGeometry& og = geometry_.owners[o];
    const int64_t entries = full / og.ratio;
    for (int64_t j = 0; j < local_full / og.ratio; ++j) {
      std::memcpy(owner.main.data() + j * og.main_entry_bytes, ks->main_entry(static_cast<int>(o), j),
                  og.main_entry_bytes);
      if (og.index_entry_bytes)
        std::memcpy(owner.index_keys.data() + j * og.index_entry_bytes, ks->index_key(static_cast<int>(o), j),
                    og.index_entry_bytes);
    }
    const int64_t tail_entries = n_tail / og.ratio;
    if (tail_entries == 0) continue;
    const uint8_t* mains = tail.data() + kv::TailCache::main_offset(geometry_, n_tail, static_cast<int>(o));
    const uint8_t* keys = tail.data() + kv::TailCache::index_offset(geometry_, n_tail, static_cast<int>(o));
    std::memcpy(owner.main.data() + entries * og.main_entry_bytes, mains, tail_entries * og.main_entry_bytes);
    if (og.index_entry_bytes)
      std::memcpy(owner.index_keys.data() + entries * og.index_entry_bytes, keys, tail_entries * og.index_entry_bytes);
  }
  cache_->release(ks);
  plan.cached_tokens = cached;
  // Replay one window, and at least every group still pending at `cached` (its compressor state is
  // rebuilt from the replayed tokens).
  plan.replay_from = cached - window;
  for (const kv::OwnerGeometry& og : geometry_.owners)
    plan.replay_from = std::min(plan.replay_from, cached / og.ratio * og.ratio);
  CEDAR_RETURN_IF_ERROR(model_.prepare_resume(seq, prompt, plan.cached_tokens, plan.replay_from));
  return plan;
}

int64_t PrefixStore::tail_payload(const model::SequenceState& seq, int64_t end, std::vector<uint8_t>* out) const {
  const int64_t bt = geometry_.block_tokens;
  const int64_t start = end / bt * bt, n = end - start;
  std::vector<uint8_t>& payload = *out;
  payload.assign(kv::TailCache::payload_bytes(geometry_, n), 0);  // [payload_bytes(n)]
  for (size_t o = 0; o < owner_index_.size(); ++o) {
    const model::KvOwnerState& owner = seq.owners[seq.owner_of_layer[owner_index_[o]]];
    const kv::OwnerGeometry& og = geometry_.owners[o];
    const int64_t first = start / og.ratio, count = n / og.ratio;
    std::memcpy(payload.data() + kv::TailCache::main_offset(geometry_, n, static_cast<int>(o)),
                owner.main.data() + first * og.main_entry_bytes, count * og.main_entry_bytes);
    if (og.index_entry_bytes)
      std::memcpy(payload.data() + kv::TailCache::index_offset(geometry_, n, static_cast<int>(o)),
                  owner.index_keys.data() + first * og.index_entry_bytes, count * og.index_entry_bytes);
  }
  return start;
}

Status PrefixStore::save_tail(const model::SequenceState& seq, int64_t end) {
  const int64_t bt = geometry_.block_tokens;
  if (end % bt == 0 || end > seq.n_tokens) return {};
  std::vector<uint8_t> payload;
  const int64_t start = tail_payload(seq, end, &payload);
  return tails_->save(std::span<const int32_t>(seq.tokens.data(), static_cast<size_t>(end)), start, end, payload);
}

Status PrefixStore::save(const model::SequenceState& seq, int64_t prompt_tokens) {
  const int64_t bt = geometry_.block_tokens;
  const int64_t n_full = (seq.n_tokens / bt) * bt;
  CEDAR_RETURN_IF_ERROR(save_tail(seq, std::min(prompt_tokens, seq.n_tokens)));
  if (prompt_tokens < seq.n_tokens) CEDAR_RETURN_IF_ERROR(save_tail(seq, seq.n_tokens));
  if (n_full == 0) {
    if (tier_) save_to_tier(nullptr, seq, prompt_tokens);
    return {};
  }
  CEDAR_ASSIGN_OR_RETURN(kv::Sequence * ks, cache_->new_sequence());
  std::span<const int32_t> tokens(seq.tokens.data(), static_cast<size_t>(n_full));
  Status st = cache_->append(*ks, tokens);
  if (st.ok()) {
    for (size_t o = 0; o < owner_index_.size(); ++o) {
      const model::KvOwnerState& owner = seq.owners[seq.owner_of_layer[owner_index_[o]]];
      const kv::OwnerGeometry& og = geometry_.owners[o];
      for (int64_t j = 0; j < n_full / og.ratio; ++j) {
        std::memcpy(ks->main_entry_mut(static_cast<int>(o), j), owner.main.data() + j * og.main_entry_bytes,
                    og.main_entry_bytes);
        if (og.index_entry_bytes)
          std::memcpy(ks->index_key_mut(static_cast<int>(o), j), owner.index_keys.data() + j * og.index_entry_bytes,
                      og.index_entry_bytes);
      }
    }
    // Boundary records: the Engram history (compressed ids) as of each block's last token.
    auto hist = ks->engram_history();
    for (int64_t k = 0; k < n_full / bt; ++k) {
      const int64_t end = (k + 1) * bt;
      for (size_t i = 0; i < hist.size(); ++i) {
        const int64_t pos = end - static_cast<int64_t>(hist.size()) + static_cast<int64_t>(i);
        hist[i] = pos >= 0 && pos < seq.engram.size() ? seq.engram.compressed[pos] : -1;
      }
      ks->capture_boundary_state(static_cast<size_t>(k));
    }
    st = cache_->commit(*ks);
    if (st.ok() && tier_) save_to_tier(ks, seq, prompt_tokens);
  }
  cache_->release(ks);
  return st;
}

size_t PrefixStore::restore_from_tier(std::span<const int32_t> prompt, size_t first, size_t n,
                                      model::SequenceState& seq) {
  if (first >= n) return 0;
  const uint32_t bt = geometry_.block_tokens;
  const std::vector<uint64_t> hashes =
      kv::chain_hashes(prompt, bt, n, kv::chain_root_hash(geometry_.layout_fingerprint()));
  return tier_->fetch_blocks(
      prompt.first(n * bt), hashes, first, [&](size_t k, std::span<const uint8_t>, std::span<const uint8_t> block) {
        // A block holds, owner after owner, its main entries then its index keys (kv/geometry.h).
        for (size_t o = 0; o < owner_index_.size(); ++o) {
          model::KvOwnerState& owner = seq.owner(owner_index_[o]);
          const kv::OwnerGeometry& og = geometry_.owners[o];
          const uint64_t first_entry = k * og.entries_per_block;
          std::memcpy(owner.main.data() + first_entry * og.main_entry_bytes, block.data() + og.main_offset,
                      uint64_t{og.entries_per_block} * og.main_entry_bytes);
          if (og.index_entry_bytes)
            std::memcpy(owner.index_keys.data() + first_entry * og.index_entry_bytes, block.data() + og.index_offset,
                        uint64_t{og.entries_per_block} * og.index_entry_bytes);
        }
        return true;
      });
}

void PrefixStore::save_to_tier(const kv::Sequence* ks, const model::SequenceState& seq, int64_t prompt_tokens) {
  const uint32_t bt = geometry_.block_tokens;
  const uint64_t layout = geometry_.layout_fingerprint();
  const std::span<const int32_t> tokens(seq.tokens.data(), static_cast<size_t>(seq.n_tokens));
  const size_t n_blocks = ks ? static_cast<size_t>(ks->n_tokens() / bt) : 0;
  // The tails: the prompt's and the whole sequence's partial last blocks (as the local tail cache).
  std::vector<int64_t> tail_ends;
  for (const int64_t end : {std::min(prompt_tokens, seq.n_tokens), seq.n_tokens})
    if (end % bt != 0 && (tail_ends.empty() || tail_ends.back() != end)) tail_ends.push_back(end);
  std::vector<int64_t> ends;
  for (size_t k = 0; k < n_blocks; ++k) ends.push_back(static_cast<int64_t>((k + 1) * bt));
  ends.insert(ends.end(), tail_ends.begin(), tail_ends.end());
  std::sort(ends.begin(), ends.end());
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
    records.push_back({kv::tier_tail_key(layout, id.digest), kv::encode_tier_record(geometry_, id, {}, payload)});
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
