#include "kv/tail_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <filesystem>

#include "core/log.h"

namespace cedar::kv {
namespace {

constexpr char kMagic[8] = {'C', 'E', 'D', 'A', 'R', 'K', 'V', 'T'};
constexpr const char* kSuffix = ".kvt";
constexpr const char* kTempSuffix = ".part";

// Header layout (little-endian):
//   0 magic "CEDARKVT" | 8 version u32 | 12 n_tokens u32 | 16 layout fingerprint u64 | 24 digest lo u64
//   32 digest hi u64 | 40 start u64 | 48 payload bytes u64 | 56 body checksum u64 (XXH3-64 of the body)
//   64 header checksum u64 (XXH3-64 of bytes [0, 64)); then n_tokens int32 ids | payload.
struct Header {
  uint32_t version = kTailFileVersion;
  uint32_t n_tokens = 0;
  uint64_t layout = 0, digest_lo = 0, digest_hi = 0, start = 0, payload_bytes = 0, body_checksum = 0;
};

template <typename T>
void put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <typename T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void encode_header(const Header& h, uint8_t* p) {
  std::memcpy(p, kMagic, 8);
  put(p + 8, h.version);
  put(p + 12, h.n_tokens);
  put(p + 16, h.layout);
  put(p + 24, h.digest_lo);
  put(p + 32, h.digest_hi);
  put(p + 40, h.start);
  put(p + 48, h.payload_bytes);
  put(p + 56, h.body_checksum);
  put(p + 64, static_cast<uint64_t>(XXH3_64bits(p, 64)));
}

// Empty string when the header is usable for this layout; otherwise why not.
std::string decode_header(const uint8_t* p, size_t n, uint64_t layout, Header* h) {
  if (n < kTailFileHeaderBytes) return "shorter than its header";
  if (std::memcmp(p, kMagic, 8) != 0) return "not a cedar tail file";
  if (get<uint64_t>(p + 64) != XXH3_64bits(p, 64)) return "header checksum mismatch";
  h->version = get<uint32_t>(p + 8);
  h->n_tokens = get<uint32_t>(p + 12);
  h->layout = get<uint64_t>(p + 16);
  h->digest_lo = get<uint64_t>(p + 24);
  h->digest_hi = get<uint64_t>(p + 32);
  h->start = get<uint64_t>(p + 40);
  h->payload_bytes = get<uint64_t>(p + 48);
  h->body_checksum = get<uint64_t>(p + 56);
  if (h->version != kTailFileVersion) return "format version " + std::to_string(h->version);
  if (h->layout != layout) return "written for another model or cache layout";
  return {};
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

bool read_whole(const std::string& path, std::vector<uint8_t>* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st{};
  bool ok = ::fstat(fd, &st) == 0;
  if (ok) {
    out->resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (ok && got < out->size()) {
      const ssize_t r = ::read(fd, out->data() + got, out->size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) ok = false;
      else got += static_cast<size_t>(r);
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace

uint64_t TailCache::payload_bytes(const CacheGeometry& g, int64_t n) {
  uint64_t b = 0;
  for (const OwnerGeometry& o : g.owners)
    b += static_cast<uint64_t>(n / o.ratio) * (uint64_t{o.main_entry_bytes} + o.index_entry_bytes);
  return b;
}

uint64_t TailCache::main_offset(const CacheGeometry& g, int64_t n, int owner) {
  uint64_t b = 0;
  for (int o = 0; o < owner; ++o)
    b += static_cast<uint64_t>(n / g.owners[o].ratio) *
         (uint64_t{g.owners[o].main_entry_bytes} + g.owners[o].index_entry_bytes);
  return b;
}

uint64_t TailCache::index_offset(const CacheGeometry& g, int64_t n, int owner) {
  return main_offset(g, n, owner) + static_cast<uint64_t>(n / g.owners[owner].ratio) * g.owners[owner].main_entry_bytes;
}

TailCache::TailCache(const CacheGeometry& g, TailCacheOptions o)
    : g_(g), opt_(std::move(o)), fs_(opt_.fs ? opt_.fs : &FileSystem::posix()) {}

TailCache::~TailCache() {
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

Result<std::unique_ptr<TailCache>> TailCache::open(const CacheGeometry& geometry, TailCacheOptions options) {
  std::unique_ptr<TailCache> c(new TailCache(geometry, std::move(options)));
  if (!c->opt_.dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(c->opt_.dir, ec);
    if (ec) return io_error("kv tail cache: cannot create directory " + c->opt_.dir, ec.value());
    c->dir_fd_ = ::open(c->opt_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->dir_fd_ < 0) return io_error("kv tail cache: cannot open directory " + c->opt_.dir, errno);
    CEDAR_RETURN_IF_ERROR(c->scan());
  }
  return c;
}

TailCache::Digest TailCache::digest(std::span<const int32_t> prefix) const {
  const XXH128_hash_t h = XXH3_128bits_withSeed(prefix.data(), prefix.size_bytes(), g_.layout_fingerprint());
  return Digest{h.low64, h.high64};
}

Status TailCache::scan() {
  DIR* d = ::opendir(opt_.dir.c_str());
  if (!d) return io_error("kv tail cache: cannot list " + opt_.dir, errno);
  struct Found {
    Digest digest;
    Tail tail;
    uint64_t mtime;
  };
  std::vector<Found> found;
  std::vector<uint8_t> bytes;
  while (dirent* de = ::readdir(d)) {
    const std::string name = de->d_name;
    const std::string path = opt_.dir + "/" + name;
    if (ends_with(name, kTempSuffix)) {
      ++stats_.temp_removed;
      ::unlink(path.c_str());
      continue;
    }
    if (!ends_with(name, kSuffix)) continue;  // not ours: left alone
    Header h;
    std::string why = read_whole(path, &bytes) ? decode_header(bytes.data(), bytes.size(), g_.layout_fingerprint(), &h)
                                               : std::string("unreadable");
    const uint64_t body = uint64_t{h.n_tokens} * 4 + h.payload_bytes;
    if (why.empty() && (h.n_tokens == 0 || h.n_tokens >= g_.block_tokens || h.start % g_.block_tokens != 0 ||
                        h.payload_bytes != payload_bytes(g_, h.n_tokens)))
      why = "inconsistent sizes";
    if (why.empty() && bytes.size() != kTailFileHeaderBytes + body) why = "size disagrees with its header";
    if (why.empty() && XXH3_64bits(bytes.data() + kTailFileHeaderBytes, body) != h.body_checksum)
      why = "body checksum mismatch";
    if (!why.empty()) {
      ++stats_.damaged;
      CEDAR_LOG_WARN("kv tail cache: removed %s: %s", path.c_str(), why.c_str());
      ::unlink(path.c_str());
      continue;
    }
    struct stat st{};
    ::stat(path.c_str(), &st);
    Found f;
    f.digest = Digest{h.digest_lo, h.digest_hi};
    f.tail.start = static_cast<int64_t>(h.start);
    f.tail.tokens.resize(h.n_tokens);
    std::memcpy(f.tail.tokens.data(), bytes.data() + kTailFileHeaderBytes, uint64_t{h.n_tokens} * 4);
    f.tail.file = name;
    f.tail.bytes = bytes.size();
    f.mtime = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<uint64_t>(st.st_mtim.tv_nsec);
    found.push_back(std::move(f));
  }
  ::closedir(d);
  // Use order survives restarts as file mtimes.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  for (Found& f : found) {
    f.tail.tick = next_tick();
    disk_bytes_ += f.tail.bytes;
    disk_[f.digest].push_back(std::move(f.tail));
    ++n_disk_;
  }
  evict(disk_, &n_disk_, opt_.disk_tails, /*disk=*/true);
  return {};
}

void TailCache::remove_file(TailMap::iterator it, size_t index, uint64_t* counter, const std::string& why) {
  Tail& t = it->second[index];
  const std::string path = opt_.dir + "/" + t.file;
  if (counter) ++*counter;
  if (!why.empty()) CEDAR_LOG_WARN("kv tail cache: removed %s: %s", path.c_str(), why.c_str());
  ::unlink(path.c_str());
  disk_bytes_ -= t.bytes;
  it->second.erase(it->second.begin() + static_cast<ptrdiff_t>(index));
  if (it->second.empty()) disk_.erase(it);
  --n_disk_;
}

void TailCache::evict(TailMap& map, uint64_t* count, uint32_t limit, bool disk) {
  while (*count > limit) {
    auto victim = map.end();
    size_t vi = 0;
    uint64_t oldest = UINT64_MAX;
    for (auto it = map.begin(); it != map.end(); ++it)
      for (size_t i = 0; i < it->second.size(); ++i)
        if (it->second[i].tick < oldest) {
          oldest = it->second[i].tick;
          victim = it;
          vi = i;
        }
    if (victim == map.end()) return;
    ++stats_.evicted;
    if (disk) {
      remove_file(victim, vi, nullptr, "");
    } else {
      victim->second.erase(victim->second.begin() + static_cast<ptrdiff_t>(vi));
      if (victim->second.empty()) map.erase(victim);
      --*count;
    }
  }
}

bool TailCache::read_file(const std::string& name, const Digest& d, int64_t start, std::vector<int32_t>* tokens,
                          std::vector<uint8_t>* payload, std::string* why) {
  std::vector<uint8_t> bytes;
  if (!read_whole(opt_.dir + "/" + name, &bytes)) {
    *why = "unreadable (vanished or cut short)";
    return false;
  }
  Header h;
  *why = decode_header(bytes.data(), bytes.size(), g_.layout_fingerprint(), &h);
  if (!why->empty()) return false;
  const uint64_t body = uint64_t{h.n_tokens} * 4 + h.payload_bytes;
  if (Digest{h.digest_lo, h.digest_hi} != d || static_cast<int64_t>(h.start) != start ||
      h.payload_bytes != payload_bytes(g_, h.n_tokens) || bytes.size() != kTailFileHeaderBytes + body) {
    *why = "header disagrees with the index";
    return false;
  }
  if (XXH3_64bits(bytes.data() + kTailFileHeaderBytes, body) != h.body_checksum) {
    *why = "body checksum mismatch";
    return false;
  }
  tokens->resize(h.n_tokens);
  std::memcpy(tokens->data(), bytes.data() + kTailFileHeaderBytes, uint64_t{h.n_tokens} * 4);
  payload->assign(bytes.begin() + static_cast<ptrdiff_t>(kTailFileHeaderBytes + uint64_t{h.n_tokens} * 4),
                  bytes.end());
  return true;
}

void TailCache::disable_persistence(int err, const std::string& what) {
  ++stats_.write_failures;
  if (stats_.persistence_disabled) return;
  stats_.persistence_disabled = true;
  CEDAR_LOG_WARN("kv tail cache: %s failed: %s. Tail persistence is OFF for the rest of this run; free space in %s "
                 "or point the cache at another directory.",
                 what.c_str(), std::strerror(err), opt_.dir.c_str());
}

void TailCache::write_file(const Digest& d, int64_t start, std::span<const int32_t> tail,
                           std::span<const uint8_t> payload) {
  Header h;
  h.n_tokens = static_cast<uint32_t>(tail.size());
  h.layout = g_.layout_fingerprint();
  h.digest_lo = d.lo;
  h.digest_hi = d.hi;
  h.start = static_cast<uint64_t>(start);
  h.payload_bytes = payload.size();
  std::vector<uint8_t> bytes(kTailFileHeaderBytes + tail.size_bytes() + payload.size());  // the whole file
  std::memcpy(bytes.data() + kTailFileHeaderBytes, tail.data(), tail.size_bytes());
  std::memcpy(bytes.data() + kTailFileHeaderBytes + tail.size_bytes(), payload.data(), payload.size());
  h.body_checksum = XXH3_64bits(bytes.data() + kTailFileHeaderBytes, bytes.size() - kTailFileHeaderBytes);
  encode_header(h, bytes.data());

  const std::string name = hex64(d.hi) + hex64(d.lo) + "-" + hex64(XXH3_64bits(tail.data(), tail.size_bytes())) + kSuffix;
  const std::string tmp = opt_.dir + "/" + name + kTempSuffix, final_path = opt_.dir + "/" + name;
  const int fd = fs_->open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return disable_persistence(errno, "creating " + tmp);
  const char* step = nullptr;
  int err = 0;
  if (!write_all(*fs_, fd, bytes.data(), bytes.size())) step = "writing ", err = errno;
  else if (fs_->fsync(fd) != 0) step = "syncing ", err = errno;
  if (fs_->close(fd) != 0 && !step) step = "closing ", err = errno;
  if (!step && fs_->rename(tmp.c_str(), final_path.c_str()) != 0) step = "renaming ", err = errno;
  if (!step && fs_->fsync(dir_fd_) != 0) step = "syncing directory of ", err = errno;
  if (step) {
    ::unlink(tmp.c_str());
    return disable_persistence(err, step + tmp);
  }
  Tail t;
  t.start = start;
  t.tokens.assign(tail.begin(), tail.end());
  t.file = name;
  t.bytes = bytes.size();
  t.tick = next_tick();
  disk_bytes_ += t.bytes;
  disk_[d].push_back(std::move(t));
  ++n_disk_;
  evict(disk_, &n_disk_, opt_.disk_tails, /*disk=*/true);
}

Status TailCache::save(std::span<const int32_t> tokens, int64_t start, int64_t end, std::span<const uint8_t> payload) {
  const int64_t n = end - start;
  if (start < 0 || start % g_.block_tokens != 0 || n < 1 || n >= g_.block_tokens ||
      end > static_cast<int64_t>(tokens.size()))
    return invalid_argument("kv tail cache: a tail must start on a block boundary and be shorter than a block");
  if (payload.size() != payload_bytes(g_, n)) return invalid_argument("kv tail cache: payload size mismatch");
  const Digest d = digest(tokens.first(static_cast<size_t>(start)));
  const auto tail = tokens.subspan(static_cast<size_t>(start), static_cast<size_t>(n));
  std::lock_guard<std::mutex> lock(mu_);
  auto same = [&](const Tail& t) { return t.start == start && std::equal(t.tokens.begin(), t.tokens.end(), tail.begin(), tail.end()); };
  std::vector<Tail>& mem = memory_[d];
  auto m = std::find_if(mem.begin(), mem.end(), same);
  if (m != mem.end()) {
    m->tick = next_tick();
    ++stats_.present;
  } else {
    Tail t;
    t.start = start;
    t.tokens.assign(tail.begin(), tail.end());
    t.payload.assign(payload.begin(), payload.end());
    t.tick = next_tick();
    mem.push_back(std::move(t));
    ++n_memory_;
    ++stats_.saved;
    evict(memory_, &n_memory_, opt_.memory_tails, /*disk=*/false);
  }
  if (dir_fd_ >= 0 && !stats_.persistence_disabled) {
    auto it = disk_.find(d);
    const bool stored = it != disk_.end() && std::any_of(it->second.begin(), it->second.end(), same);
    if (!stored) write_file(d, start, tail, payload);
  }
  return {};
}

int64_t TailCache::lookup(std::span<const int32_t> prompt, int64_t start, int64_t max_tokens,
                          std::vector<uint8_t>* payload) {
  max_tokens = std::min<int64_t>({max_tokens, static_cast<int64_t>(prompt.size()) - start, g_.block_tokens - 1});
  if (start < 0 || start % g_.block_tokens != 0 || max_tokens < 1) return 0;
  const Digest d = digest(prompt.first(static_cast<size_t>(start)));
  const auto rest = prompt.subspan(static_cast<size_t>(start));
  auto fits = [&](const Tail& t) {
    return t.start == start && static_cast<int64_t>(t.tokens.size()) <= max_tokens &&
           std::equal(t.tokens.begin(), t.tokens.end(), rest.begin());
  };
  std::lock_guard<std::mutex> lock(mu_);
  Tail* best = nullptr;
  if (auto it = memory_.find(d); it != memory_.end())
    for (Tail& t : it->second)
      if (fits(t) && (!best || t.tokens.size() > best->tokens.size())) best = &t;
  // A longer tail on disk wins over the memory one.
  size_t disk_best = SIZE_MAX;
  auto dit = disk_.find(d);
  if (dit != disk_.end())
    for (size_t i = 0; i < dit->second.size(); ++i) {
      const Tail& t = dit->second[i];
      const size_t have = best ? best->tokens.size() : 0;
      if (fits(t) && t.tokens.size() > have &&
          (disk_best == SIZE_MAX || t.tokens.size() > dit->second[disk_best].tokens.size()))
        disk_best = i;
    }
  if (disk_best != SIZE_MAX) {
    std::vector<int32_t> tokens;
    std::string why;
    const std::string file = dit->second[disk_best].file;
    if (read_file(file, d, start, &tokens, payload, &why) &&
        std::equal(tokens.begin(), tokens.end(), dit->second[disk_best].tokens.begin(), dit->second[disk_best].tokens.end())) {
      Tail& t = dit->second[disk_best];
      t.tick = next_tick();
      timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
      ::utimensat(dir_fd_, file.c_str(), times, 0);
      ++stats_.hits_disk;
      return static_cast<int64_t>(tokens.size());
    }
    remove_file(dit, disk_best, &stats_.damaged, why.empty() ? "tokens disagree with the index" : why);
  }
  if (best) {
    best->tick = next_tick();
    // Its disk copy counts as used too (eviction order there; persists as the file's mtime).
    if (dit != disk_.end())
      for (Tail& t : dit->second)
        if (t.start == start && t.tokens == best->tokens) {
          t.tick = best->tick;
          timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
          ::utimensat(dir_fd_, t.file.c_str(), times, 0);
        }
    *payload = best->payload;
    ++stats_.hits_memory;
    return static_cast<int64_t>(best->tokens.size());
  }
  ++stats_.misses;
  return 0;
}

TailCacheStats TailCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TailCacheStats s = stats_;
  s.memory_tails = n_memory_;
  s.disk_tails = n_disk_;
  s.disk_bytes = disk_bytes_;
  return s;
}

}  // namespace cedar::kv
