#include "kv/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace cedar::kv {

Result<std::unique_ptr<KvCache>> KvCache::create(const CacheGeometry& geometry, const KvCacheOptions& options) {
  std::unique_ptr<KvCache> c(new KvCache(geometry, options));
  CEDAR_ASSIGN_OR_RETURN(c->pool_, BlockPool::create(geometry, options.capacity_blocks));
  c->index_ = std::make_unique<PrefixIndex>(*c->pool_, chain_root_hash(geometry.layout_fingerprint()),
                                            options.hash ? options.hash : xxh3_chain_hash);
  return c;
}

KvCache::~KvCache() {
  for (auto& [id, s] : seqs_)
    for (BlockId b : s->blocks_) pool_->release(b);
  seqs_.clear();
  index_.reset();  // drops the index's references before the pool goes
}

std::optional<BlockId> KvCache::allocate_block() {
  for (;;) {
    if (auto b = pool_->allocate()) return b;
    if (!index_->evict_one()) return std::nullopt;
  }
}

std::optional<BlockId> KvCache::copy_block(BlockId src) {
  for (;;) {
    if (auto b = pool_->copy(src)) return b;
    if (!index_->evict_one()) return std::nullopt;
  }
}

Status KvCache::init_private_state(Sequence& s) {
  s.g_ = &g_;
  s.pool_ = pool_.get();
  CEDAR_ASSIGN_OR_RETURN(s.window_, AnonymousRegion::map(g_.window_bytes_per_sequence(), "an SWA ring"));
  s.tail_offset_.resize(g_.owners.size());
  uint64_t off = 0;
  for (size_t o = 0; o < g_.owners.size(); ++o) {
    s.tail_offset_[o] = off;
    off += g_.owners[o].live_tail_bytes;
  }
  s.tails_.assign(off, 0);
  s.engram_.assign(g_.engram_history, 0);
  return {};
}

Result<Sequence*> KvCache::new_sequence() {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Sequence> s(new Sequence());
  s->id_ = next_id_++;
  CEDAR_RETURN_IF_ERROR(init_private_state(*s));
  Sequence* raw = s.get();
  seqs_.emplace(raw->id_, std::move(s));
  ++stats_.sequences;
  return raw;
}

Result<Sequence*> KvCache::fork(const Sequence& parent) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<Sequence> s(new Sequence());
  s->id_ = next_id_++;
  CEDAR_RETURN_IF_ERROR(init_private_state(*s));
  s->tokens_ = parent.tokens_;
  s->blocks_ = parent.blocks_;
  for (BlockId b : s->blocks_) pool_->retain(b);
  s->nodes_ = parent.nodes_;
  s->hashes_ = parent.hashes_;
  s->disk_saved_blocks_ = parent.disk_saved_blocks_;
  s->reused_tokens_ = parent.reused_tokens_;
  if (s->window_.size()) std::memcpy(s->window_.data(), parent.window_.data(), s->window_.size());
  s->tails_ = parent.tails_;
  s->engram_ = parent.engram_;
  Sequence* raw = s.get();
  seqs_.emplace(raw->id_, std::move(s));
  ++stats_.sequences;
  return raw;
}

void KvCache::release(Sequence* seq) {
  if (!seq) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = seqs_.find(seq->id_);
  CEDAR_CHECK(it != seqs_.end() && it->second.get() == seq, "release of an unknown sequence");
  for (BlockId b : seq->blocks_) pool_->release(b);
  seqs_.erase(it);
}

void KvCache::ensure_hashes(Sequence& s, size_t n_full) {
  const uint32_t bt = g_.block_tokens;
  uint64_t h = s.hashes_.empty() ? index_->root_hash() : s.hashes_.back();
  while (s.hashes_.size() < n_full) {
    const size_t k = s.hashes_.size();
    h = index_->hash_fn()(h, std::span<const int32_t>(s.tokens_).subspan(k * bt, bt));
    s.hashes_.push_back(h);
  }
}

void KvCache::restore_boundary_state(Sequence& s) {
  if (s.blocks_.empty()) return;
  const uint8_t* src = pool_->boundary_state(s.blocks_.back());
  for (size_t o = 0; o < g_.owners.size(); ++o) {
    const uint64_t n = g_.owners[o].boundary_tail_bytes;
    if (n) std::memcpy(s.tails_.data() + s.tail_offset_[o], src + g_.boundary_tail_offset(static_cast<int>(o)), n);
  }
  if (!s.engram_.empty())
    std::memcpy(s.engram_.data(), src + g_.engram_history_offset(), s.engram_.size() * sizeof(int64_t));
}

Result<int64_t> KvCache::attach_prefix(Sequence& seq, std::span<const int32_t> prompt, int64_t max_tokens) {
  std::unique_lock<std::mutex> lock(mu_);
  if (seq.n_tokens() != 0) return failed_precondition("kv: attach_prefix needs an empty sequence");
  const uint32_t bt = g_.block_tokens;
  const int64_t limit = std::clamp<int64_t>(max_tokens, 0, static_cast<int64_t>(prompt.size()));
  const size_t n_full = static_cast<size_t>(limit / bt);
  if (n_full == 0) return int64_t{0};
  std::vector<uint64_t> hashes = chain_hashes(prompt, bt, n_full, index_->root_hash(), index_->hash_fn());

  PrefixIndex::Match m = index_->lookup(prompt, hashes, n_full);
  // Hold the matched blocks now so allocations for the disk part cannot evict them.
  for (BlockId b : m.blocks) pool_->retain(b);
  const size_t from_memory = m.blocks.size();
  if (opt_.disk && m.blocks.size() < n_full) {
    // The disk reads run without the lock (other sequences keep appending meanwhile); each block read
    // takes it to allocate and index its copy. `seq` is not yet visible to anyone else.
    lock.unlock();
    opt_.disk->load(prompt, hashes, from_memory,
                    [&](size_t k, std::span<const uint8_t> kv, std::span<const uint8_t> boundary) {
                      std::lock_guard<std::mutex> block_lock(mu_);
                      const auto b = allocate_block();
                      if (!b) return false;
                      std::memcpy(pool_->block_data(*b), kv.data(), kv.size());
                      std::memcpy(pool_->boundary_state(*b), boundary.data(), boundary.size());
                      const PrefixIndex::NodeId parent = m.nodes.empty() ? PrefixIndex::kRoot : m.nodes.back();
                      m.nodes.push_back(index_->insert(parent, hashes[k], prompt.subspan(k * bt, bt), *b));
                      m.blocks.push_back(*b);
                      return true;
                    });
    lock.lock();
  }
  const size_t n = m.blocks.size();
  seq.tokens_.assign(prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(n * bt));
  seq.blocks_ = m.blocks;
  seq.nodes_ = m.nodes;
  hashes.resize(n);
  seq.hashes_ = std::move(hashes);
  seq.reused_tokens_ = static_cast<int64_t>(n * bt);
  restore_boundary_state(seq);
  stats_.reused_tokens_memory += from_memory * bt;
  stats_.reused_tokens_disk += (n - from_memory) * bt;
  return seq.reused_tokens_;
}

void KvCache::reserve(Sequence& seq, int64_t n_tokens) {
  seq.tokens_.reserve(static_cast<size_t>(n_tokens));
  seq.blocks_.reserve(blocks_for_tokens(n_tokens, g_.block_tokens));
}

Status KvCache::append(Sequence& seq, std::span<const int32_t> tokens) {
  if (tokens.empty()) return {};
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t bt = g_.block_tokens;
  const int64_t old_n = seq.n_tokens();
  const int64_t new_n = old_n + static_cast<int64_t>(tokens.size());
  const size_t first = static_cast<size_t>(old_n / bt);
  const size_t last = static_cast<size_t>((new_n - 1) / bt);
  auto full_error = [&](size_t needed) {
    return resource_exhausted("kv: cache full: " + std::to_string(needed) + " more blocks of " + std::to_string(bt) +
                              " tokens needed, the " + std::to_string(pool_->capacity_blocks()) +
                              " blocks are held by live sequences; raise the KV capacity or shorten the request");
  };
  // Fresh blocks go straight to the table (no allocation in a decode step once reserve() sized it);
  // a failure gives them back, so nothing changes.
  const size_t had = seq.blocks_.size();
  auto undo = [&] {
    while (seq.blocks_.size() > had) {
      pool_->release(seq.blocks_.back());
      seq.blocks_.pop_back();
    }
  };
  for (size_t k = had; k <= last; ++k) {
    const auto b = allocate_block();
    if (!b) {
      const size_t needed = last + 1 - had;
      undo();
      return full_error(needed);
    }
    seq.blocks_.push_back(*b);
  }
  // The new tokens' first block is a partial block this sequence already lists: if anyone else holds
  // it (a fork, the index after a truncate), copy it now, before its first divergent write.
  if (first < had && pool_->refcount(seq.blocks_[first]) > 1) {
    const auto copy = copy_block(seq.blocks_[first]);
    if (!copy) {
      const size_t needed = seq.blocks_.size() - had + 1;
      undo();
      return full_error(needed);
    }
    pool_->release(seq.blocks_[first]);
    seq.blocks_[first] = *copy;
    if (first < seq.nodes_.size()) seq.nodes_.resize(first);
  }
  seq.tokens_.insert(seq.tokens_.end(), tokens.begin(), tokens.end());
  return {};
}

Status KvCache::truncate(Sequence& seq, int64_t n_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  if (n_tokens < 0 || n_tokens > seq.n_tokens())
    return invalid_argument("kv: truncate to " + std::to_string(n_tokens) + " tokens, sequence has " +
                            std::to_string(seq.n_tokens()));
  const uint32_t bt = g_.block_tokens;
  const size_t keep_blocks = blocks_for_tokens(n_tokens, bt);
  while (seq.blocks_.size() > keep_blocks) {
    pool_->release(seq.blocks_.back());
    seq.blocks_.pop_back();
  }
  seq.tokens_.resize(static_cast<size_t>(n_tokens));
  const size_t full = static_cast<size_t>(n_tokens / bt);
  if (seq.nodes_.size() > full) seq.nodes_.resize(full);
  if (seq.hashes_.size() > full) seq.hashes_.resize(full);
  seq.disk_saved_blocks_ = std::min(seq.disk_saved_blocks_, full);
  seq.reused_tokens_ = std::min(seq.reused_tokens_, n_tokens);
  return {};
}

Status KvCache::commit(Sequence& seq) {
  std::vector<DiskPrefixCache::BlockView> views;
  std::vector<int32_t> tokens;  // [n_full * block_tokens] the committed prefix
  std::vector<uint64_t> hashes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint32_t bt = g_.block_tokens;
    const size_t n_full = static_cast<size_t>(seq.n_tokens() / bt);
    ensure_hashes(seq, n_full);
    seq.nodes_.resize(n_full, PrefixIndex::kRoot);
    PrefixIndex::NodeId parent = PrefixIndex::kRoot;
    for (size_t k = 0; k < n_full; ++k) {
      // An entry can vanish from the index (evicted while another block held the content): re-add it.
      if (seq.nodes_[k] == PrefixIndex::kRoot || !index_->contains(seq.nodes_[k])) {
        seq.nodes_[k] = index_->insert(parent, seq.hashes_[k],
                                       std::span<const int32_t>(seq.tokens_).subspan(k * bt, bt), seq.blocks_[k]);
        ++stats_.committed_blocks;
      }
      parent = seq.nodes_[k];
    }
    if (!opt_.disk || n_full <= seq.disk_saved_blocks_) return {};
    for (size_t k = 0; k < n_full; ++k)
      views.push_back({pool_->block_data(seq.blocks_[k]), pool_->boundary_state(seq.blocks_[k])});
    tokens.assign(seq.tokens_.begin(), seq.tokens_.begin() + static_cast<ptrdiff_t>(n_full * bt));
    hashes = seq.hashes_;
  }
  // Disk I/O outside the lock: the views stay valid because this sequence holds its blocks, and full
  // blocks are never written again.
  const DiskPrefixCache::SaveResult r = opt_.disk->save(tokens, hashes, views);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.disk_saved_blocks += r.written;
  if (r.complete) seq.disk_saved_blocks_ = views.size();
  return {};
}

KvCacheStats KvCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvCacheStats s = stats_;
  s.pool = pool_->stats();
  s.index = index_->stats();
  return s;
}

}  // namespace cedar::kv
