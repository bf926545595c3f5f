#include "kv/redis_tier.h"

#include <hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "core/log.h"
#include "kv/tail_cache.h"

namespace cedar::kv {

namespace {

using Clock = std::chrono::steady_clock;

// Blocks fetched or written are not sent again for this long (Redis may evict them meanwhile; a block
// then goes out again on a later save).
constexpr auto kKnownTtl = std::chrono::seconds(60);
constexpr size_t kKnownMax = 1 << 18;

// A lookup in one round trip. KEYS: the n block keys in order, then the tail hash at each of the n + 1
// block boundaries; ARGV[1]: n. Returns {the blocks of the longest run present, the tails (field,
// value, ...) stored at the boundary where the run stops, the run's length, the 1-based index of a
// key holding another type (0: none)}. Read-only: the client verifies every value and deletes bad ones.
constexpr const char* kLookupScript = R"lua(
local n = tonumber(ARGV[1])
local blocks, stop, wrong = {}, n, 0
for i = 1, n do
  local v = redis.pcall('GET', KEYS[i])
  if type(v) ~= 'string' then
    if type(v) == 'table' and v.err then wrong = i end
    stop = i - 1
    break
  end
  blocks[i] = v
end
local tails = redis.pcall('HGETALL', KEYS[n + 1 + stop])
if type(tails) ~= 'table' or tails.err then
  if wrong == 0 then wrong = n + 1 + stop end
  tails = {}
end
return {blocks, tails, stop, wrong}
)lua";

timeval to_timeval(int ms) {
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

bool parse_int(std::string_view s, int lo, int hi, int* out) {
  int v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// hiredis writes with write(2): on a connection Redis has dropped that raises SIGPIPE, whose default
// action ends the process (`cedar serve` ignores it; `cedar chat` and `generate` do not). Every call
// into hiredis blocks it on the calling thread and swallows one that came meanwhile.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    sigset_t pending;
    sigemptyset(&pending);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) && !sigismember(&old_, SIGPIPE)) {
      const timespec now{};
      while (sigtimedwait(&pipe_, nullptr, &now) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_, old_;
};

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// One command, waited for; nullptr with c->err set on I/O failure.
Reply command(redisContext* c, const std::vector<std::string_view>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (auto a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return Reply(static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
}

bool append(redisContext* c, const std::vector<std::string_view>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (auto a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return redisAppendCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data()) == REDIS_OK;
}

Reply next_reply(redisContext* c) {
  void* r = nullptr;
  if (redisGetReply(c, &r) != REDIS_OK) return nullptr;
  return Reply(static_cast<redisReply*>(r));
}

// The reply to what was appended, by `deadline` however Redis drips its bytes: each socket read waits
// only for the time left (hiredis alone would give every read the full command timeout).
Reply reply_by(redisContext* c, Clock::time_point deadline) {
  auto left_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  };
  int done = 0;
  while (!done) {
    if (left_ms() <= 0) return nullptr;
    redisSetTimeout(c, to_timeval(static_cast<int>(std::max<long long>(left_ms(), 1))));
    if (redisBufferWrite(c, &done) != REDIS_OK) return nullptr;
  }
  void* r = nullptr;
  if (redisGetReplyFromReader(c, &r) != REDIS_OK) return nullptr;
  while (!r) {
    const long long left = left_ms();
    if (left <= 0) {
      errno = EAGAIN;  // io_reason names a missed deadline
      c->err = REDIS_ERR_IO;
      std::snprintf(c->errstr, sizeof(c->errstr), "the lookup's deadline passed");
      return nullptr;
    }
    redisSetTimeout(c, to_timeval(static_cast<int>(std::max<long long>(left, 1))));
    if (redisBufferRead(c) != REDIS_OK) return nullptr;
    if (redisGetReplyFromReader(c, &r) != REDIS_OK) return nullptr;
  }
  return Reply(static_cast<redisReply*>(r));
}

std::string io_reason(const redisContext* c) {
  if (!c) return "out of memory";
  std::string s = c->errstr[0] ? c->errstr : "I/O error";
  // hiredis reports a missed socket deadline as EAGAIN.
  if (c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK || s.find("temporarily") != std::string::npos))
    s += " (no answer within the deadline: Redis is paused, overloaded or unreachable)";
  return s;
}

}  // namespace

std::string RedisEndpoint::redacted() const {
  std::string s = "redis://";
  if (!user.empty() || !password.empty()) s += user + (password.empty() ? "" : ":***") + "@";
  return s + host + ":" + std::to_string(port) + "/" + std::to_string(db);
}

Result<RedisEndpoint> parse_redis_url(const std::string& url) {
  const std::string usage = "; expected redis://[user:password@]HOST:PORT[/DB]";
  if (url.rfind("rediss://", 0) == 0)
    return invalid_argument("--kv-tier " + url.substr(0, 9) +
                            "...: TLS is not available: this build's hiredis (0.14) has no TLS support. Reach "
                            "Redis over a trusted network or a local TLS tunnel (stunnel, spiped) and give "
                            "redis://HOST:PORT");
  if (url.rfind("redis://", 0) != 0) return invalid_argument("--kv-tier: '" + url + "' is not a redis:// URL" + usage);
  RedisEndpoint e;
  std::string_view rest = std::string_view(url).substr(8);
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view cred = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = cred.find(':');
    e.user = std::string(cred.substr(0, colon));
    if (colon != std::string_view::npos) e.password = std::string(cred.substr(colon + 1));
  }
  std::string_view hostport = rest;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    hostport = rest.substr(0, slash);
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && !parse_int(db, 0, 1 << 20, &e.db))
      return invalid_argument("--kv-tier: database '" + std::string(db) + "' is not a number" + usage);
  }
  std::string_view port;
  if (!hostport.empty() && hostport.front() == '[') {  // [IPv6]:port
    const size_t close = hostport.find(']');
    if (close == std::string_view::npos) return invalid_argument("--kv-tier: unclosed '[' in the host" + usage);
    if (close + 1 < hostport.size()) {
      if (hostport[close + 1] != ':') return invalid_argument("--kv-tier: junk after the IPv6 host" + usage);
      port = hostport.substr(close + 2);
    }
    hostport = hostport.substr(1, close - 1);
  } else if (const size_t colon = hostport.rfind(':'); colon != std::string_view::npos) {
    port = hostport.substr(colon + 1);
    hostport = hostport.substr(0, colon);
  }
  if (!port.empty() && !parse_int(port, 1, 65535, &e.port))
    return invalid_argument("--kv-tier: port '" + std::string(port) + "' is not 1..65535" + usage);
  if (hostport.empty()) return invalid_argument("--kv-tier: no host in the URL" + usage);
  e.host = std::string(hostport);
  return e;
}

Result<std::unique_ptr<RedisTier>> RedisTier::open(const RedisTierOptions& options, const CacheGeometry& geometry) {
  CEDAR_ASSIGN_OR_RETURN(RedisEndpoint e, parse_redis_url(options.url));
  if (!options.password.empty()) e.password = options.password;
  std::unique_ptr<RedisTier> t(new RedisTier(options, std::move(e), geometry));
  CEDAR_LOG_INFO("kv tier: sharing prefixes through %s (keys %s*)", t->endpoint_.redacted().c_str(),
                 tier_key_prefix(t->layout_).c_str());
  {
    // Connect now so that a Redis down at start is reported at start (the server starts anyway).
    std::lock_guard<std::mutex> lock(t->lookup_mu_);
    SigpipeGuard no_sigpipe;
    t->ensure(t->lookup_);
  }
  t->writer_thread_ = std::thread([p = t.get()] { p->writer_loop(); });
  return t;
}

RedisTier::RedisTier(const RedisTierOptions& o, RedisEndpoint e, const CacheGeometry& g)
    : opt_(o), endpoint_(std::move(e)), g_(g), layout_(g.layout_fingerprint()) {
  stats_.configured = true;
}

RedisTier::~RedisTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_thread_.joinable()) writer_thread_.join();
  close(lookup_);
  close(writer_);
}

void RedisTier::close(Connection& c) {
  if (c.ctx) redisFree(c.ctx);
  c.ctx = nullptr;
}

bool RedisTier::ensure(Connection& c) {
  if (c.ctx) return true;
  if (Clock::now() < c.retry_at) return false;
  redisContext* ctx =
      redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port, to_timeval(opt_.connect_timeout_ms));
  if (!ctx || ctx->err) {
    const std::string why = io_reason(ctx);
    if (ctx) redisFree(ctx);
    fail(c, "connecting: " + why);
    return false;
  }
  c.ctx = ctx;
  redisSetTimeout(ctx, to_timeval(opt_.command_timeout_ms));
  redisEnableKeepAlive(ctx);
  auto setup = [&](const std::vector<std::string_view>& args, const char* what) {
    Reply r = command(ctx, args);
    if (!r) {
      fail(c, std::string(what) + ": " + io_reason(ctx));
      return false;
    }
    if (r->type == REDIS_REPLY_ERROR) {
      const std::string msg(r->str, r->len);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.error_replies;
      }
      fail(c, std::string(what) + ": Redis answered " + msg);
      return false;
    }
    return true;
  };
  if (!endpoint_.password.empty()) {
    const bool ok = endpoint_.user.empty() ? setup({"AUTH", endpoint_.password}, "AUTH")
                                           : setup({"AUTH", endpoint_.user, endpoint_.password}, "AUTH");
    if (!ok) return false;
  }
  const std::string db = std::to_string(endpoint_.db);
  if (endpoint_.db != 0 && !setup({"SELECT", db}, "SELECT")) return false;
  if (!setup({"PING"}, "PING")) return false;
  c.backoff_ms = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.connects;
    // Redis may have restarted empty: what was known to be there may not be.
    known_.clear();
  }
  succeed();
  return true;
}

void RedisTier::fail(Connection& c, const std::string& what) {
  close(c);
  c.backoff_ms = c.backoff_ms == 0 ? opt_.min_backoff_ms : std::min(opt_.max_backoff_ms, c.backoff_ms * 2);
  c.retry_at = Clock::now() + std::chrono::milliseconds(c.backoff_ms);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.errors;
  if (stats_.up || stats_.outages == 0) {
    ++stats_.outages;
    CEDAR_LOG_WARN(
        "kv tier: %s is unavailable (%s); going on with the memory and disk caches, retrying with "
        "backoff (up to %d s)",
        endpoint_.redacted().c_str(), what.c_str(), opt_.max_backoff_ms / 1000);
  }
  stats_.up = false;
}

void RedisTier::succeed() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stats_.up && stats_.outages > 0) CEDAR_LOG_INFO("kv tier: %s is back", endpoint_.redacted().c_str());
  stats_.up = true;
}

void RedisTier::remember(uint64_t hash) {
  std::lock_guard<std::mutex> lock(mu_);
  if (known_.size() >= kKnownMax) known_.clear();
  known_[hash] = Clock::now();
}

bool RedisTier::wants_block(uint64_t hash) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = known_.find(hash);
  if (it == known_.end()) return true;
  if (Clock::now() - it->second > kKnownTtl) {
    known_.erase(it);
    return true;
  }
  ++stats_.skipped_known;
  return false;
}

void RedisTier::count_bad(TierRecordStatus s, const std::string& key, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  switch (s) {
    case TierRecordStatus::kForeign: ++stats_.foreign; break;
    case TierRecordStatus::kStale: ++stats_.stale; break;
    case TierRecordStatus::kMismatch: ++stats_.mismatch; break;
    default: ++stats_.corrupt; break;
  }
  if (!bad_value_logged_) {
    bad_value_logged_ = true;
    CEDAR_LOG_WARN("kv tier: ignored and deleted %s: %s (%s); later bad values are only counted in /metrics",
                   key.c_str(), reason.c_str(), tier_record_status_name(s));
  }
}

void RedisTier::delete_keys(Connection& c, const std::vector<std::pair<std::string, std::string>>& keys) {
  if (keys.empty() || !c.ctx) return;
  for (const auto& [key, field] : keys)
    if (!(field.empty() ? append(c.ctx, {"DEL", key}) : append(c.ctx, {"HDEL", key, field})))
      return fail(c, "DEL: " + io_reason(c.ctx));
  uint64_t deleted = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    Reply r = next_reply(c.ctx);
    if (!r) return fail(c, "DEL: " + io_reason(c.ctx));
    if (r->type == REDIS_REPLY_INTEGER) deleted += static_cast<uint64_t>(r->integer);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.deleted += deleted;
}

RedisTier::Found RedisTier::lookup(std::span<const int32_t> prompt, std::span<const uint64_t> hashes,
                                   size_t first_block, int64_t max_tokens, const BlockSink& sink,
                                   std::vector<uint8_t>* tail) {
  Found found;
  const uint32_t bt = g_.block_tokens;
  if (first_block > hashes.size() || max_tokens <= static_cast<int64_t>(first_block) * bt) return found;
  const size_t n = hashes.size() - first_block;
  std::lock_guard<std::mutex> guard(lookup_mu_);
  SigpipeGuard no_sigpipe;
  if (!ensure(lookup_)) return found;
  const auto t0 = Clock::now();
  // One deadline for the whole call: the command timeout, plus the time the requested bytes take at
  // lookup_floor_mb_per_s (a long prefix is a large reply).
  const uint64_t requested = n * (kTierRecordHeaderBytes + g_.boundary_state_bytes + g_.block_bytes) +
                             TailCache::payload_bytes(g_, bt - 1);
  const auto deadline = t0 + std::chrono::milliseconds(opt_.command_timeout_ms) +
                        std::chrono::microseconds(requested / std::max(1, opt_.lookup_floor_mb_per_s));
  // Digests of the prefix at every block boundary from first_block on: block k's record names
  // [0, (k + 1) * bt); the tails at boundary b are keyed by [0, b * bt).
  std::vector<int64_t> boundaries;
  for (size_t b = first_block; b <= hashes.size(); ++b) boundaries.push_back(static_cast<int64_t>(b * bt));
  const std::vector<PrefixDigest> at = prefix_digests(prompt, boundaries, layout_);
  std::vector<std::string> keys;
  for (size_t k = first_block; k < hashes.size(); ++k) keys.push_back(tier_block_key(layout_, hashes[k]));
  for (const PrefixDigest& d : at) keys.push_back(tier_tail_key(layout_, d));
  const std::string numkeys = std::to_string(keys.size()), n_blocks = std::to_string(n);
  std::vector<std::string_view> args = {"EVAL", kLookupScript, numkeys};
  for (const std::string& k : keys) args.push_back(k);
  args.push_back(n_blocks);
  if (!append(lookup_.ctx, args)) {
    fail(lookup_, "EVAL: " + io_reason(lookup_.ctx));
    return found;
  }
  Reply r = reply_by(lookup_.ctx, deadline);
  if (!r) {
    fail(lookup_, "EVAL: " + io_reason(lookup_.ctx));
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.lookups;
    return found;
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 4 || r->element[0]->type != REDIS_REPLY_ARRAY ||
      r->element[2]->type != REDIS_REPLY_INTEGER || r->element[3]->type != REDIS_REPLY_INTEGER) {
    // An error reply (scripting refused to this user, BUSY, ...): the lookup misses.
    const std::string what = r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "an unexpected reply";
    r.reset();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.lookups;
      ++stats_.error_replies;
    }
    fail(lookup_, "EVAL: Redis answered " + what + " (the lookup is a Lua script: allow EVAL to this user)");
    return found;
  }
  const redisReply* blocks = r->element[0];
  const size_t stop = std::min<size_t>(static_cast<size_t>(std::max<long long>(r->element[2]->integer, 0)), n);
  std::vector<std::pair<std::string, std::string>> bad;  // (key, hash field or empty)
  if (const long long wrong = r->element[3]->integer; wrong >= 1 && static_cast<size_t>(wrong) <= keys.size())
    bad.push_back({keys[wrong - 1], {}});  // WRONGTYPE: not ours
  uint64_t bytes = 0;
  bool run = true;
  for (size_t i = 0; i < blocks->elements && i < stop; ++i) {
    const redisReply* v = blocks->element[i];
    if (v->type != REDIS_REPLY_STRING) break;
    bytes += v->len;
    const size_t k = first_block + i;
    TierRecordIdentity id;
    id.kind = TierRecordKind::kBlock;
    id.chain_hash = hashes[k];
    id.digest = at[i + 1];
    id.start = static_cast<int64_t>(k * bt);
    id.tokens = prompt.subspan(k * bt, bt);
    std::span<const uint8_t> boundary, payload;
    const TierRecordCheck check =
        decode_tier_record(std::span(reinterpret_cast<const uint8_t*>(v->str), v->len), g_, id, &boundary, &payload);
    if (!check.ok()) {
      // Checked past the end of the run too: every bad value fetched is deleted.
      count_bad(check.status, keys[i], check.reason);
      bad.push_back({keys[i], {}});
      run = false;
    } else if (run && sink(k, boundary, payload)) {
      ++found.blocks;
      remember(hashes[k]);
    } else {
      run = false;  // a sound block after a gap is not usable without the ones before it
    }
  }
  // The tails the script fetched start where its run of blocks stopped: usable when every block of the
  // run was delivered. The longest that fits and names this prompt's tokens wins; one of another
  // continuation of the same prefix is simply not ours.
  const redisReply* tails = r->element[1];
  if (found.blocks == stop && tails->type == REDIS_REPLY_ARRAY && tails->elements >= 2) {
    const int64_t start = static_cast<int64_t>((first_block + stop) * bt);
    const int64_t longest = std::min<int64_t>(
        {max_tokens - start, static_cast<int64_t>(bt) - 1, static_cast<int64_t>(prompt.size()) - start});
    std::vector<int64_t> ends;
    for (int64_t e = 1; e <= longest; ++e) ends.push_back(start + e);
    const std::vector<PrefixDigest> digests = prefix_digests(prompt, ends, layout_);
    const std::string& key = keys[n + stop];
    for (size_t f = 0; f + 1 < tails->elements; f += 2) {
      const redisReply* field = tails->element[f];
      const redisReply* v = tails->element[f + 1];
      if (field->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) continue;
      int len = 0;
      const std::string name(field->str, field->len);
      if (!parse_int(name, 1, static_cast<int>(bt) - 1, &len)) {
        bad.push_back({key, name});
        continue;
      }
      if (len > longest || len <= found.tail_tokens) continue;
      bytes += v->len;
      TierRecordIdentity id;
      id.kind = TierRecordKind::kTail;
      id.digest = digests[len - 1];
      id.start = start;
      id.tokens = prompt.subspan(static_cast<size_t>(start), static_cast<size_t>(len));
      std::span<const uint8_t> body;
      const TierRecordCheck check =
          decode_tier_record(std::span(reinterpret_cast<const uint8_t*>(v->str), v->len), g_, id, nullptr, &body);
      if (check.status == TierRecordStatus::kMismatch) continue;
      if (!check.ok()) {
        count_bad(check.status, key + " " + name, check.reason);
        bad.push_back({key, name});
        continue;
      }
      tail->assign(body.begin(), body.end());
      found.tail_tokens = len;
    }
  }
  r.reset();
  delete_keys(lookup_, bad);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.lookups;
  stats_.hit_blocks += found.blocks;
  if (found.tail_tokens) ++stats_.hit_tails;
  stats_.hit_tokens += found.blocks * bt + static_cast<uint64_t>(found.tail_tokens);
  stats_.fetched_bytes += bytes;
  stats_.lookup_seconds += seconds;
  return found;
}

void RedisTier::save_async(std::vector<Record> records, std::vector<uint64_t> block_hashes) {
  if (records.empty()) return;
  WriteJob job;
  for (const Record& r : records) job.bytes += r.key.size() + r.value.size();
  job.records = std::move(records);
  job.block_hashes = std::move(block_hashes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || stats_.queued_bytes + job.bytes > opt_.write_queue_bytes) {
      stats_.dropped_writes += job.records.size();
      return;
    }
    stats_.queued_bytes += job.bytes;
    stats_.queued_records += job.records.size();
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

bool RedisTier::flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return queue_.empty() && !writing_; });
}

void RedisTier::write_job(WriteJob& job) {
  SigpipeGuard no_sigpipe;
  size_t sent = 0;
  uint64_t bytes = 0;
  bool ok = ensure(writer_);
  if (ok) {
    for (const Record& r : job.records) {
      const std::string_view value(reinterpret_cast<const char*>(r.value.data()), r.value.size());
      if (!(r.field.empty() ? append(writer_.ctx, {"SET", r.key, value})
                            : append(writer_.ctx, {"HSET", r.key, r.field, value}))) {
        fail(writer_, "SET: " + io_reason(writer_.ctx));
        ok = false;
        break;
      }
    }
  }
  std::string error_reply;
  uint64_t error_replies = 0;
  if (ok) {
    for (size_t i = 0; i < job.records.size(); ++i) {
      Reply r = next_reply(writer_.ctx);
      if (!r) {
        fail(writer_, "SET: " + io_reason(writer_.ctx));
        break;
      }
      if (r->type == REDIS_REPLY_ERROR) {
        // OOM under maxmemory + noeviction, READONLY replica, ...: the record is not stored.
        ++error_replies;
        if (error_reply.empty()) error_reply.assign(r->str, r->len);
        continue;
      }
      ++sent;
      bytes += job.records[i].value.size();
      if (i < job.block_hashes.size()) remember(job.block_hashes[i]);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.written_records += sent;
  stats_.written_bytes += bytes;
  stats_.dropped_writes += job.records.size() - sent;
  if (error_replies) {
    stats_.error_replies += error_replies;
    ++stats_.errors;
    if (stats_.up) {
      ++stats_.outages;
      stats_.up = false;
      CEDAR_LOG_WARN(
          "kv tier: %s refused %llu writes (%s); prefixes are still cached in memory and on disk. "
          "Give Redis an eviction policy (maxmemory-policy allkeys-lru) or more maxmemory",
          endpoint_.redacted().c_str(), static_cast<unsigned long long>(error_replies), error_reply.c_str());
    }
  } else if (sent == job.records.size() && !stats_.up) {
    if (stats_.outages > 0) CEDAR_LOG_INFO("kv tier: %s is back", endpoint_.redacted().c_str());
    stats_.up = true;
  }
}

void RedisTier::writer_loop() {
  Clock::time_point drain_until{};
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_ && drain_until == Clock::time_point{})
      drain_until = Clock::now() + std::chrono::milliseconds(opt_.drain_ms);
    if (queue_.empty() || (stop_ && Clock::now() > drain_until)) {
      if (stop_) {
        for (const WriteJob& j : queue_) stats_.dropped_writes += j.records.size();
        queue_.clear();
        stats_.queued_bytes = stats_.queued_records = 0;
        cv_.notify_all();
        return;
      }
      continue;
    }
    WriteJob job = std::move(queue_.front());
    queue_.pop_front();
    stats_.queued_bytes -= job.bytes;
    stats_.queued_records -= job.records.size();
    writing_ = true;
    lock.unlock();
    write_job(job);
    lock.lock();
    writing_ = false;
    cv_.notify_all();
  }
}

RedisTierStats RedisTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace cedar::kv
