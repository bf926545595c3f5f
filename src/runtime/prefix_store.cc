#include "runtime/prefix_store.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/log.h"
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
  return ps;
}

Result<ResumePlan> PrefixStore::restore(std::span<const int32_t> prompt, ReplayMode mode, model::SequenceState& seq) {
  ResumePlan plan;
  if (mode == ReplayMode::kFull || prompt.size() < 2) return plan;
  CEDAR_ASSIGN_OR_RETURN(kv::Sequence * ks, cache_->new_sequence());
  auto h = cache_->attach_prefix(*ks, prompt, static_cast<int64_t>(prompt.size()) - 1);
  if (!h.ok()) {
    cache_->release(ks);
    return h.status();
  }
  const int64_t full = *h;
  // The longest tail after the whole blocks (still leaving one prompt token to run).
  std::vector<uint8_t> tail;  // [TailCache::payload_bytes(n_tail)]
  const int64_t n_tail = tails_->lookup(prompt, full, static_cast<int64_t>(prompt.size()) - 1 - full, &tail);
  const int64_t cached = full + n_tail;
  const int64_t window = model_.config().window_size;
  // A prefix no longer than the window is replayed whole: that is a cold prefill.
  if (cached <= window) {
    cache_->release(ks);
    return plan;
  }
  for (size_t o = 0; o < owner_index_.size(); ++o) {
    model::KvOwnerState& owner = seq.owner(owner_index_[o]);
    const kv::OwnerGeometry& og = geometry_.owners[o];
    const int64_t entries = full / og.ratio;
    for (int64_t j = 0; j < entries; ++j) {
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

Status PrefixStore::save_tail(const model::SequenceState& seq, int64_t end) {
  const int64_t bt = geometry_.block_tokens;
  const int64_t start = end / bt * bt, n = end - start;
  if (n == 0 || end > seq.n_tokens) return {};
  std::vector<uint8_t> payload(kv::TailCache::payload_bytes(geometry_, n));  // [payload_bytes(n)]
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
  return tails_->save(std::span<const int32_t>(seq.tokens.data(), static_cast<size_t>(end)), start, end, payload);
}

Status PrefixStore::save(const model::SequenceState& seq, int64_t prompt_tokens) {
  const int64_t bt = geometry_.block_tokens;
  const int64_t n_full = (seq.n_tokens / bt) * bt;
  CEDAR_RETURN_IF_ERROR(save_tail(seq, std::min(prompt_tokens, seq.n_tokens)));
  if (prompt_tokens < seq.n_tokens) CEDAR_RETURN_IF_ERROR(save_tail(seq, seq.n_tokens));
  if (n_full == 0) return {};
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
  }
  cache_->release(ks);
  return st;
}

kv::KvCacheStats PrefixStore::memory_stats() const { return cache_->stats(); }
kv::DiskCacheStats PrefixStore::disk_stats() const { return disk_ ? disk_->stats() : kv::DiskCacheStats{}; }
kv::TailCacheStats PrefixStore::tail_stats() const { return tails_->stats(); }

}  // namespace cedar::runtime
