// RedisTier: the shared prefix-cache tier, the third level after memory and the local disk cache.
// Replicas of one model behind a load balancer store their whole KV blocks and tails in one Redis
// (or Valkey), so a conversation's next turn on another replica, or on any replica after a restart,
// restores its prefix instead of a cold prefill. Records and keys: tier_record.h.
//
// The tier never holds a request up and never hands out wrong KV:
//   * A lookup (the caller's thread) is one round trip: a read-only Lua script (EVAL) walks the block
//     keys after the local prefix and returns the longest run present with the tails stored where it
//     stops. The whole lookup has one deadline, however Redis drips its reply; connecting has its own.
//   * Writes are asynchronous: save() encodes the records and queues them (a byte-bounded queue; when
//     it is full the write is dropped and counted); one writer thread with its own connection sends
//     them, pipelined.
//   * Redis down at start, lost, slow (its replies miss the deadline), full (maxmemory under
//     noeviction) or answering errors: the call gives up, the caller goes on with memory and disk,
//     one warning is logged per outage, /metrics counts it, and the connection is retried with
//     exponential backoff (up to max_backoff_ms).
//   * A value that fails a check (format version, checksum, model, identity) is never used: it is
//     counted and its key deleted.
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kv/geometry.h"
#include "kv/tier_record.h"

struct redisContext;  // hiredis

namespace cedar::kv {

// Where the tier is: redis://[user[:password]@]host[:port][/db].
struct RedisEndpoint {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string user;
  std::string password;
  // The URL without the password, for logs.
  std::string redacted() const;
};
// Parses the URL; `rediss://` (TLS) is refused: the hiredis this build links (0.14) has no TLS.
Result<RedisEndpoint> parse_redis_url(const std::string& url);

struct RedisTierOptions {
  std::string url;       // empty: no shared tier
  std::string password;  // when set, replaces the URL's (from a file or the environment)
  int connect_timeout_ms = 300;
  int command_timeout_ms = 1000;  // a call's deadline (a lookup: plus its bytes at lookup_floor_mb_per_s)
  int lookup_floor_mb_per_s = 100;  // the slowest transfer a lookup's deadline allows for
  int min_backoff_ms = 250;       // first retry after a failure, doubling up to max_backoff_ms
  int max_backoff_ms = 30000;
  uint64_t write_queue_bytes = 256ull << 20;  // encoded records waiting for the writer
  int drain_ms = 2000;                        // at shutdown, how long queued writes may still go out
};

struct RedisTierStats {
  bool configured = false;
  bool up = false;       // the last call succeeded
  uint64_t lookups = 0;  // lookup rounds sent
  uint64_t hit_blocks = 0, hit_tails = 0, hit_tokens = 0;
  uint64_t fetched_bytes = 0;
  double lookup_seconds = 0;
  uint64_t written_records = 0, written_bytes = 0;
  uint64_t skipped_known = 0;                     // blocks not sent again: written or fetched in the last known_ttl
  uint64_t dropped_writes = 0;                    // records dropped: queue full, tier down, or shutting down
  uint64_t queued_records = 0, queued_bytes = 0;  // now
  uint64_t errors = 0;                            // failed calls (I/O, timeout, error replies)
  uint64_t error_replies = 0;                     // of which Redis answered with an error (OOM, NOAUTH, ...)
  uint64_t outages = 0;                           // up -> down transitions (each logged once)
  uint64_t connects = 0;                          // successful connections
  uint64_t corrupt = 0, foreign = 0, stale = 0, mismatch = 0;  // bad values seen (and deleted)
  uint64_t deleted = 0;
};

class RedisTier {
 public:
  // Fails only on a bad URL: an unreachable Redis is an outage, not an error.
  static Result<std::unique_ptr<RedisTier>> open(const RedisTierOptions& options, const CacheGeometry& geometry);
  ~RedisTier();
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;

  // Receives block k's verified boundary state and KV; returns false to stop.
  using BlockSink = std::function<bool(size_t k, std::span<const uint8_t> boundary, std::span<const uint8_t> kv)>;
  struct Found {
    size_t blocks = 0;        // delivered to the sink
    int64_t tail_tokens = 0;  // the tail's length (0: none)
  };
  // One round trip. Blocks [first_block, hashes.size()) of `prompt` (hashes: their chain hashes): the
  // longest run that Redis holds, each verified, handed to `sink` in order; and, where that run ends,
  // the longest stored tail of `prompt` that keeps the restored prefix within max_tokens tokens, its
  // payload (TailCache layout) in *tail. Bad values fetched are counted and deleted.
  Found lookup(std::span<const int32_t> prompt, std::span<const uint64_t> hashes, size_t first_block,
               int64_t max_tokens, const BlockSink& sink, std::vector<uint8_t>* tail);

  // Whether block `hash` still needs sending (not written or fetched within the last known_ttl).
  bool wants_block(uint64_t hash);
  // Queues records for the writer (never blocks on Redis). `block_hashes`: the blocks among them.
  struct Record {
    std::string key;
    std::vector<uint8_t> value;
    std::string field;  // a tail's length: the record is that field of the hash `key` (empty: a string key)
  };
  void save_async(std::vector<Record> records, std::vector<uint64_t> block_hashes);
  // Blocks until the queue is empty and the writer idle (tests and benchmarks); false on timeout.
  bool flush(std::chrono::milliseconds timeout);

  RedisTierStats stats() const;
  uint64_t layout_fingerprint() const { return layout_; }
  const RedisEndpoint& endpoint() const { return endpoint_; }

 private:
  // One hiredis connection with its backoff; used by one thread at a time.
  struct Connection {
    redisContext* ctx = nullptr;
    std::chrono::steady_clock::time_point retry_at{};
    int backoff_ms = 0;
  };
  struct WriteJob {
    std::vector<Record> records;
    std::vector<uint64_t> block_hashes;
    uint64_t bytes = 0;
  };

  RedisTier(const RedisTierOptions& o, RedisEndpoint e, const CacheGeometry& g);
  // A usable connection, or false (in backoff, or connecting failed).
  bool ensure(Connection& c);
  void fail(Connection& c, const std::string& what);
  void succeed();
  void close(Connection& c);
  void writer_loop();
  void write_job(WriteJob& job);
  void remember(uint64_t hash);
  void delete_keys(Connection& c, const std::vector<std::pair<std::string, std::string>>& keys);  // (key, field)
  void count_bad(TierRecordStatus s, const std::string& key, const std::string& reason);

  RedisTierOptions opt_;
  RedisEndpoint endpoint_;
  CacheGeometry g_;
  uint64_t layout_ = 0;
  std::mutex lookup_mu_;  // the lookup connection
  Connection lookup_;
  Connection writer_;  // writer thread only

  mutable std::mutex mu_;  // stats_, queue_, known_, the up/down state
  std::condition_variable cv_;
  std::deque<WriteJob> queue_;
  bool writing_ = false;
  bool stop_ = false;
  std::unordered_map<uint64_t, std::chrono::steady_clock::time_point> known_;
  RedisTierStats stats_;
  bool bad_value_logged_ = false;
  std::thread writer_thread_;
};

}  // namespace cedar::kv
