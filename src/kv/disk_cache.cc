#include "kv/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

#include "core/check.h"
#include "core/log.h"

namespace cedar::kv {

namespace {

constexpr const char* kLockName = "LOCK";
constexpr const char* kBlockSuffix = ".kvb";
constexpr const char* kTempSuffix = ".part";

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

bool parse_hex64(const std::string& s, size_t pos, uint64_t* out) {
  if (pos + 16 > s.size()) return false;
  uint64_t v = 0;
  for (size_t i = pos; i < pos + 16; ++i) {
    const char c = s[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

// Reads exactly n bytes at offset; false on error or short file.
bool pread_all(int fd, void* dst, size_t n, off_t offset) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += r;
  }
  return true;
}

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

DiskPrefixCache::DiskPrefixCache(std::string dir, const CacheGeometry& g, DiskCacheOptions o)
    : dir_(std::move(dir)), g_(g), opt_(o), fs_(o.fs ? o.fs : &FileSystem::posix()) {
  stats_.budget_bytes = o.budget_bytes;
  std::random_device rd;
  uid_state_ = (uint64_t{rd()} << 32) ^ rd() ^ now_ns() ^ (uint64_t(::getpid()) << 17);
}

DiskPrefixCache::~DiskPrefixCache() {
  if (dir_fd_ >= 0) ::close(dir_fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing drops the flock
}

Result<std::unique_ptr<DiskPrefixCache>> DiskPrefixCache::open(const std::string& dir, const CacheGeometry& geometry,
                                                               DiskCacheOptions options) {
  if (dir.empty()) return invalid_argument("kv disk cache: empty directory path");
  std::unique_ptr<DiskPrefixCache> c(new DiskPrefixCache(dir, geometry, options));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // like mkdir -p; an existing directory is fine
  if (ec) return io_error("kv disk cache: cannot create directory " + dir, ec.value());
  c->dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (c->dir_fd_ < 0) return io_error("kv disk cache: cannot open directory " + dir, errno);
  const std::string lock = dir + "/" + kLockName;
  c->lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (c->lock_fd_ < 0) return io_error("kv disk cache: cannot create lock file " + lock, errno);
  if (::flock(c->lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK)
      return failed_precondition("kv disk cache: " + dir +
                                 " is in use by another cedar process; give each process its own cache directory");
    return io_error("kv disk cache: cannot lock " + lock, errno);
  }
  CEDAR_RETURN_IF_ERROR(c->scan());
  return c;
}

std::string DiskPrefixCache::file_path(uint64_t hash, uint64_t uid) const {
  return dir_ + "/" + hex64(hash) + "-" + hex64(uid) + kBlockSuffix;
}

std::string DiskPrefixCache::temp_path(uint64_t uid) const { return dir_ + "/" + hex64(uid) + kTempSuffix; }

uint64_t DiskPrefixCache::block_file_bytes() const {
  return kBlockFileHeaderBytes + uint64_t{g_.block_tokens} * 4 + g_.boundary_state_bytes + g_.block_bytes;
}

Status DiskPrefixCache::scan() {
  DIR* d = ::opendir(dir_.c_str());
  if (!d) return io_error("kv disk cache: cannot list " + dir_, errno);
  struct Found {
    Entry e;
    uint64_t mtime;
  };
  std::vector<Found> found;
  auto drop = [&](const std::string& path, uint64_t* counter, const std::string& reason) {
    ++*counter;
    CEDAR_LOG_WARN("kv disk cache: removed %s: %s", path.c_str(), reason.c_str());
    ::unlink(path.c_str());
  };
  std::vector<uint8_t> header(kBlockFileHeaderBytes);  // [128]
  while (dirent* de = ::readdir(d)) {
    const std::string name = de->d_name;
    const std::string path = dir_ + "/" + name;
    if (ends_with(name, kTempSuffix)) {
      // Left by a write that never reached its rename (crash, kill -9, full disk): never complete.
      ++stats_.temp_removed;
      CEDAR_LOG_INFO("kv disk cache: removed interrupted write %s", path.c_str());
      ::unlink(path.c_str());
      continue;
    }
    if (!ends_with(name, kBlockSuffix)) continue;  // not ours: left alone
    uint64_t name_hash = 0, name_uid = 0;
    const bool named = name.size() == 16 + 1 + 16 + std::strlen(kBlockSuffix) && name[16] == '-' &&
                       parse_hex64(name, 0, &name_hash) && parse_hex64(name, 17, &name_uid);
    if (!named) {
      drop(path, &stats_.foreign, "file name is not <hash>-<uid>.kvb");
      continue;
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st{};
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      if (fd >= 0) ::close(fd);
      drop(path, &stats_.corrupt, std::string("unreadable: ") + std::strerror(errno));
      continue;
    }
    const size_t want = std::min<uint64_t>(kBlockFileHeaderBytes, static_cast<uint64_t>(st.st_size));
    const bool read_ok = pread_all(fd, header.data(), want, 0);
    ::close(fd);
    if (!read_ok) {
      drop(path, &stats_.truncated, "header unreadable");
      continue;
    }
    BlockFileHeader h;
    const BlockFileCheck check =
        parse_block_header(std::span(header.data(), want), static_cast<uint64_t>(st.st_size), g_, &h);
    if (!check.ok()) {
      uint64_t* counter = check.status == BlockFileStatus::kForeign  ? &stats_.foreign
                          : check.status == BlockFileStatus::kStale  ? &stats_.stale
                          : check.status == BlockFileStatus::kTruncated ? &stats_.truncated
                                                                     : &stats_.corrupt;
      drop(path, counter, check.reason);
      continue;
    }
    if (h.chain_hash != name_hash || h.uid != name_uid) {
      drop(path, &stats_.corrupt, "file name disagrees with its header");
      continue;
    }
    const uint64_t mtime = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull +
                           static_cast<uint64_t>(st.st_mtim.tv_nsec);
    found.push_back({Entry{h.chain_hash, h.uid, h.parent_uid, h.depth, static_cast<uint64_t>(st.st_size)}, mtime});
  }
  ::closedir(d);

  // Keep only files reachable from a depth-0 file through consistent parent links, parents first.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.e.depth != b.e.depth ? a.e.depth < b.e.depth : a.e.uid < b.e.uid;
  });
  for (const Found& f : found) {
    const Entry& e = f.e;
    bool reachable = e.depth == 0 && e.parent_uid == 0;
    if (!reachable) {
      auto p = entries_.find(e.parent_uid);
      reachable = p != entries_.end() && p->second.depth + 1 == e.depth;
    }
    if (!reachable || entries_.count(e.uid)) {
      drop(file_path(e.hash, e.uid), &stats_.orphaned,
           entries_.count(e.uid) ? "duplicate uid" : "its parent block file is missing");
      continue;
    }
    entries_[e.uid] = e;
    by_hash_.emplace(e.hash, e.uid);
    if (e.parent_uid) children_[e.parent_uid].push_back(e.uid);
    lru_.add(e.uid, e.parent_uid, e.size, f.mtime);
    last_tick_ = std::max(last_tick_, f.mtime);
  }
  // The budget may have been lowered since the files were written.
  while (lru_.total_bytes() > opt_.budget_bytes) {
    const auto v = lru_.victim();
    if (!v) break;
    remove_subtree(*v, &stats_.evicted, "");
  }
  if (!entries_.empty())
    CEDAR_LOG_INFO("kv disk cache: %s holds %zu block files (%.1f MiB)", dir_.c_str(), entries_.size(),
                   lru_.total_bytes() / 1048576.0);
  return {};
}

void DiskPrefixCache::remove_subtree(uint64_t uid, uint64_t* counter, const std::string& reason) {
  // Depth-first, children before their parent (PrefixLru removes leaves only).
  std::vector<uint64_t> order;
  std::vector<uint64_t> stack = {uid};
  while (!stack.empty()) {
    const uint64_t u = stack.back();
    stack.pop_back();
    order.push_back(u);
    if (auto it = children_.find(u); it != children_.end())
      stack.insert(stack.end(), it->second.begin(), it->second.end());
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const uint64_t u = *it;
    const Entry e = entries_.at(u);
    const std::string path = file_path(e.hash, e.uid);
    if (u == uid) {
      ++*counter;
      if (!reason.empty()) CEDAR_LOG_WARN("kv disk cache: removed %s: %s", path.c_str(), reason.c_str());
    } else {
      ++stats_.orphaned;
    }
    ::unlink(path.c_str());
    auto [lo, hi] = by_hash_.equal_range(e.hash);
    for (auto h = lo; h != hi; ++h) {
      if (h->second == u) {
        by_hash_.erase(h);
        break;
      }
    }
    if (e.parent_uid) {
      auto& sib = children_[e.parent_uid];
      sib.erase(std::remove(sib.begin(), sib.end(), u), sib.end());
      if (sib.empty()) children_.erase(e.parent_uid);
    }
    children_.erase(u);
    lru_.remove(u);
    entries_.erase(u);
  }
}

uint64_t DiskPrefixCache::match(uint64_t parent_uid, uint64_t hash, std::span<const int32_t> block_tokens) {
  std::vector<uint64_t> candidates;
  auto [lo, hi] = by_hash_.equal_range(hash);
  for (auto it = lo; it != hi; ++it) candidates.push_back(it->second);
  std::vector<int32_t> stored(block_tokens.size());  // [block_tokens] a candidate file's token ids
  for (const uint64_t uid : candidates) {
    auto it = entries_.find(uid);
    if (it == entries_.end()) continue;  // removed with an earlier candidate's subtree
    const Entry e = it->second;
    if (e.parent_uid != parent_uid) {
      ++stats_.hash_collisions;
      continue;
    }
    const std::string path = file_path(e.hash, e.uid);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const bool ok = fd >= 0 && pread_all(fd, stored.data(), block_tokens.size_bytes(), kBlockFileHeaderBytes);
    if (fd >= 0) ::close(fd);
    if (!ok) {
      remove_subtree(uid, &stats_.truncated, "tokens unreadable (file vanished or was cut short)");
      continue;
    }
    if (std::equal(stored.begin(), stored.end(), block_tokens.begin())) return uid;
    ++stats_.hash_collisions;
  }
  return 0;
}

uint64_t DiskPrefixCache::next_tick() {
  last_tick_ = std::max(now_ns(), last_tick_ + 1);
  return last_tick_;
}

uint64_t DiskPrefixCache::new_uid() {
  for (;;) {
    const uint64_t u = splitmix64(uid_state_);
    if (u != 0 && !entries_.count(u)) return u;
  }
}

void DiskPrefixCache::touch_chain(const std::vector<uint64_t>& chain) {
  if (chain.empty()) return;
  const uint64_t tick = next_tick();
  lru_.touch_path(chain.back(), tick);
  // Persist the use time as the mtime of every file on the path so the order survives a restart.
  timespec times[2];
  times[0].tv_sec = 0;
  times[0].tv_nsec = UTIME_OMIT;
  times[1].tv_sec = static_cast<time_t>(tick / 1000000000ull);
  times[1].tv_nsec = static_cast<long>(tick % 1000000000ull);
  for (const uint64_t uid : chain) {
    const Entry& e = entries_.at(uid);
    ::utimensat(AT_FDCWD, file_path(e.hash, e.uid).c_str(), times, 0);
  }
}

bool DiskPrefixCache::make_room(uint64_t bytes, const std::vector<uint64_t>& chain) {
  if (bytes > opt_.budget_bytes) return false;
  while (lru_.total_bytes() + bytes > opt_.budget_bytes) {
    // Never evict the prefix being saved to make room for its own continuation.
    const auto v = lru_.victim(
        [&chain](uint64_t uid) { return std::find(chain.begin(), chain.end(), uid) == chain.end(); });
    if (!v) return false;
    remove_subtree(*v, &stats_.evicted, "");
  }
  return true;
}

void DiskPrefixCache::disable_persistence(int err, const std::string& what) {
  ++stats_.write_failures;
  if (stats_.persistence_disabled) return;
  stats_.persistence_disabled = true;
  const bool full = err == ENOSPC || err == EDQUOT;
  CEDAR_LOG_WARN(
      "kv disk cache: %s: %s failed: %s. %s Prefix persistence is OFF for the rest of this run; cached "
      "prefixes already on disk are still used. Free space there or point the cache at another directory.",
      dir_.c_str(), what.c_str(), std::strerror(err), full ? "The disk is full." : "");
}

uint64_t DiskPrefixCache::write_block(uint64_t parent_uid, uint32_t depth, uint64_t hash,
                                      std::span<const int32_t> block_tokens, const BlockView& view) {
  BlockFileHeader h;
  h.layout_fingerprint = g_.layout_fingerprint();
  h.chain_hash = hash;
  h.uid = new_uid();
  h.parent_uid = parent_uid;
  h.depth = depth;
  h.block_tokens = g_.block_tokens;
  h.boundary_state_bytes = g_.boundary_state_bytes;
  h.raw_payload_bytes = g_.block_bytes;
  const std::vector<uint8_t> bytes =  // [file_bytes] the whole file
      encode_block_file(h, block_tokens, std::span(view.boundary_state, g_.boundary_state_bytes),
                        std::span(view.kv, g_.block_bytes), opt_.zstd_level);
  const std::string tmp = temp_path(h.uid);
  const std::string final_path = file_path(hash, h.uid);
  const int fd = fs_->open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    disable_persistence(errno, "creating " + tmp);
    return 0;
  }
  // Each step records the errno of the first failure; later steps only run while all is well.
  const char* step = nullptr;
  int err = 0;
  auto failed = [&](const char* what) {
    step = what;
    err = errno;
  };
  if (!write_all(*fs_, fd, bytes.data(), bytes.size())) failed("writing ");
  else if (fs_->fsync(fd) != 0) failed("syncing ");
  if (fs_->close(fd) != 0 && !step) failed("closing ");
  if (!step && fs_->rename(tmp.c_str(), final_path.c_str()) != 0) failed("renaming ");
  if (step) {
    ::unlink(tmp.c_str());
    disable_persistence(err, step + tmp);
    return 0;
  }
  // The rename is durable once the directory entry is.
  if (fs_->fsync(dir_fd_) != 0) {
    const int e = errno;
    ::unlink(final_path.c_str());
    disable_persistence(e, "syncing directory " + dir_);
    return 0;
  }
  Entry e{hash, h.uid, parent_uid, depth, bytes.size()};
  entries_[h.uid] = e;
  by_hash_.emplace(hash, h.uid);
  if (parent_uid) children_[parent_uid].push_back(h.uid);
  lru_.add(h.uid, parent_uid, e.size, next_tick());
  ++stats_.saved_blocks;
  return h.uid;
}

DiskPrefixCache::SaveResult DiskPrefixCache::save(std::span<const int32_t> tokens, std::span<const uint64_t> hashes,
                                                  std::span<const BlockView> blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  SaveResult r;
  const uint32_t bt = g_.block_tokens;
  CEDAR_CHECK(blocks.size() <= hashes.size() && blocks.size() * bt <= tokens.size(), "save: inconsistent sizes");
  std::vector<uint64_t> chain;
  uint64_t parent = 0;
  for (size_t k = 0; k < blocks.size(); ++k) {
    const auto block_tokens = tokens.subspan(k * bt, bt);
    uint64_t uid = match(parent, hashes[k], block_tokens);
    if (uid) {
      ++r.present;
      ++stats_.present_blocks;
    } else {
      if (stats_.persistence_disabled) {
        ++stats_.skipped_saves;
        r.complete = false;
        break;
      }
      if (!make_room(block_file_bytes(), chain)) {
        ++stats_.budget_stops;
        r.complete = false;
        break;
      }
      uid = write_block(parent, static_cast<uint32_t>(k), hashes[k], block_tokens, blocks[k]);
      if (!uid) {
        r.complete = false;
        break;
      }
      ++r.written;
    }
    chain.push_back(uid);
    parent = uid;
  }
  touch_chain(chain);
  return r;
}

size_t DiskPrefixCache::load(std::span<const int32_t> tokens, std::span<const uint64_t> hashes, size_t first_block,
                             const BlockSink& sink) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t bt = g_.block_tokens;
  const size_t n = std::min(hashes.size(), tokens.size() / bt);
  std::vector<uint64_t> chain;
  std::vector<uint8_t> file;                               // [file size] one block file
  std::vector<int32_t> stored_tokens(bt);                  // [block_tokens]
  std::vector<uint8_t> boundary(g_.boundary_state_bytes);  // [boundary_state_bytes]
  std::vector<uint8_t> kv(g_.block_bytes);                 // [block_bytes] decoded KV payload
  size_t delivered = 0;
  uint64_t parent = 0;
  for (size_t k = 0; k < n; ++k) {
    const auto block_tokens = tokens.subspan(k * bt, bt);
    const uint64_t uid = match(parent, hashes[k], block_tokens);
    if (!uid) break;
    if (k >= first_block) {
      const Entry e = entries_.at(uid);
      const std::string path = file_path(e.hash, e.uid);
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st{};
      bool read_ok = fd >= 0 && ::fstat(fd, &st) == 0;
      if (read_ok) {
        file.resize(static_cast<size_t>(st.st_size));
        read_ok = pread_all(fd, file.data(), file.size(), 0);
      }
      if (fd >= 0) ::close(fd);
      if (!read_ok) {
        remove_subtree(uid, &stats_.truncated, "unreadable or cut short");
        break;
      }
      BlockFileHeader h;
      BlockFileCheck check = decode_block_file(file, g_, &h, stored_tokens, boundary, kv);
      if (check.ok() && (h.uid != uid || h.parent_uid != parent || h.depth != k || h.chain_hash != hashes[k]))
        check = {BlockFileStatus::kCorrupt, "header identity disagrees with the index"};
      if (check.ok() && !std::equal(stored_tokens.begin(), stored_tokens.end(), block_tokens.begin()))
        check = {BlockFileStatus::kCorrupt, "tokens changed since the lookup"};
      if (!check.ok()) {
        uint64_t* counter = check.status == BlockFileStatus::kTruncated ? &stats_.truncated
                            : check.status == BlockFileStatus::kStale   ? &stats_.stale
                            : check.status == BlockFileStatus::kForeign ? &stats_.foreign
                                                                        : &stats_.corrupt;
        remove_subtree(uid, counter, check.reason);
        break;
      }
      if (!sink(k, kv, boundary)) break;
      ++delivered;
      ++stats_.loaded_blocks;
    }
    chain.push_back(uid);
    parent = uid;
  }
  // Only what was used counts as used: the matched chain up to the last delivered block.
  if (delivered > 0) {
    chain.resize(first_block + delivered);
    touch_chain(chain);
  }
  return delivered;
}

size_t DiskPrefixCache::stored_blocks(std::span<const int32_t> tokens, std::span<const uint64_t> hashes) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t bt = g_.block_tokens;
  const size_t n = std::min(hashes.size(), tokens.size() / bt);
  uint64_t parent = 0;
  size_t k = 0;
  for (; k < n; ++k) {
    parent = match(parent, hashes[k], tokens.subspan(k * bt, bt));
    if (!parent) break;
  }
  return k;
}

DiskCacheStats DiskPrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DiskCacheStats s = stats_;
  s.files = entries_.size();
  s.bytes = lru_.total_bytes();
  return s;
}

}  // namespace cedar::kv
