#include "io/block_reader.h"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "core/log.h"

namespace cedar::io {

BlockReader::~BlockReader() {
  for (File& f : files_)
    if (f.fd >= 0) ::close(f.fd);
}

void BlockReader::submit(const ReadRequest& r) {
  CEDAR_CHECK(r.file < files_.size() && r.need <= r.length && r.dest != nullptr, "bad read request");
  if (files_[r.file].direct)
    CEDAR_CHECK(r.offset % kDirectIoAlignment == 0 && r.length % kDirectIoAlignment == 0 &&
                    reinterpret_cast<uintptr_t>(r.dest) % kDirectIoAlignment == 0,
                "unaligned O_DIRECT read of %s at %llu (+%llu)", files_[r.file].path.c_str(),
                static_cast<unsigned long long>(r.offset), static_cast<unsigned long long>(r.length));
  // The queue is a vector drained from queue_head_; it is compacted when empty, so it stops growing
  // once it reached the largest burst (no allocation in steady state).
  if (queue_head_ == queued_.size()) {
    queued_.clear();
    queue_head_ = 0;
  }
  queued_.push_back(r);
}

bool BlockReader::pop_queued(ReadRequest* r) {
  if (queue_head_ == queued_.size()) return false;
  *r = queued_[queue_head_++];
  if (queue_head_ == queued_.size()) {
    queued_.clear();
    queue_head_ = 0;
  }
  return true;
}

void BlockReader::account(const ReadRequest& r, int64_t result, ReadCompletion* c) {
  c->tag = r.tag;
  c->file = r.file;
  c->offset = r.offset;
  c->error = result < 0 ? static_cast<int>(-result) : (static_cast<uint64_t>(result) < r.need ? ENODATA : 0);
  c->bytes = result > 0 ? static_cast<uint64_t>(result) : 0;
  bytes_read_ += c->bytes;
  ++reads_;
}

size_t BlockReader::reap(std::span<ReadCompletion> out, bool wait) {
  start_queued();
  if (outstanding() == 0 || out.empty()) return 0;
  const size_t n = collect(out, wait);
  start_queued();
  return n;
}

namespace {

// io_uring backend: one ring, up to queue_depth reads in flight; user_data indexes a table of the
// requests in flight (a free list of its entries), so completions map back without allocating.
class UringReader final : public BlockReader {
 public:
  static std::unique_ptr<UringReader> create(unsigned depth, int* err) {
    std::unique_ptr<UringReader> r(new UringReader());
    const int rc = io_uring_queue_init(depth, &r->ring_, 0);
    if (rc < 0) {
      *err = -rc;
      return nullptr;
    }
    r->ring_ok_ = true;
    r->slots_.resize(depth);
    for (unsigned i = 0; i < depth; ++i) r->free_.push_back(depth - 1 - i);
    return r;
  }
  ~UringReader() override {
    // Reads still in flight write into the caller's memory: wait for them before the ring goes.
    while (in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_, &cqe) < 0) break;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
    }
    if (ring_ok_) io_uring_queue_exit(&ring_);
  }
  const char* backend() const override { return "io_uring"; }

 private:
  UringReader() = default;
  void start_queued() override {
    bool any = false;
    ReadRequest r;
    while (!free_.empty() && queue_head_ < queued_.size()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) break;
      pop_queued(&r);
      const uint32_t slot = free_.back();
      free_.pop_back();
      slots_[slot] = r;
      io_uring_prep_read(sqe, files_[r.file].fd, r.dest, static_cast<unsigned>(r.length), r.offset);
      // Punt to io_uring's workers at once: an O_DIRECT read on a device whose queue is full would
      // otherwise block inside io_uring_submit, on the thread that should be computing.
      io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
      io_uring_sqe_set_data64(sqe, slot);
      ++in_flight_;
      any = true;
    }
    if (any) io_uring_submit(&ring_);
  }
  size_t collect(std::span<ReadCompletion> out, bool wait) override {
    size_t n = 0;
    while (n < out.size() && in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      int rc = (wait && n == 0) ? io_uring_wait_cqe(&ring_, &cqe) : io_uring_peek_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0 || !cqe) break;
      const uint32_t slot = static_cast<uint32_t>(io_uring_cqe_get_data64(cqe));
      const int64_t res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
      ReadRequest& r = slots_[slot];
      free_.push_back(slot);
      if (res > 0 && static_cast<uint64_t>(res) < r.need && static_cast<uint64_t>(res) < r.length &&
          static_cast<uint64_t>(res) % kDirectIoAlignment == 0) {
        // A short read that is not the end of file (rare): read the rest as a new request.
        bytes_read_ += static_cast<uint64_t>(res);
        ReadRequest rest = r;
        rest.offset += res;
        rest.dest += res;
        rest.length -= res;
        rest.need -= res;
        submit(rest);
        continue;
      }
      account(r, res, &out[n++]);
    }
    return n;
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  std::vector<ReadRequest> slots_;
  std::vector<uint32_t> free_;
};

// Fallback: worker threads doing pread. Requests and completions pass through two queues under
// one mutex; the queues' vectors keep their capacity.
class PreadReader final : public BlockReader {
 public:
  explicit PreadReader(int threads) {
    todo_.reserve(4096);
    done_.reserve(4096);
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
  }
  ~PreadReader() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_work_.notify_all();
    for (auto& t : workers_) t.join();
  }
  const char* backend() const override { return "pread pool"; }

 private:
  void start_queued() override {
    ReadRequest r;
    bool any = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (pop_queued(&r)) {
        todo_.push_back(r);
        ++in_flight_;
        any = true;
      }
    }
    if (any) cv_work_.notify_all();
  }
  size_t collect(std::span<ReadCompletion> out, bool wait) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (wait) cv_done_.wait(lock, [&] { return !done_.empty(); });
    size_t n = 0;
    while (n < out.size() && !done_.empty()) {
      const auto& [r, res] = done_.back();
      account(r, res, &out[n++]);
      done_.pop_back();
      --in_flight_;
    }
    return n;
  }
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_work_.wait(lock, [&] { return stop_ || todo_head_ < todo_.size(); });
      if (stop_) return;
      ReadRequest r = todo_[todo_head_++];
      if (todo_head_ == todo_.size()) {
        todo_.clear();
        todo_head_ = 0;
      }
      lock.unlock();
      int64_t got = 0;
      while (static_cast<uint64_t>(got) < r.length) {
        const ssize_t n = ::pread(files_[r.file].fd, r.dest + got, r.length - got, static_cast<off_t>(r.offset + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          got = -errno;
          break;
        }
        if (n == 0) break;  // end of file
        got += n;
      }
      lock.lock();
      done_.push_back({r, got});
      cv_done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::vector<ReadRequest> todo_;
  size_t todo_head_ = 0;
  std::vector<std::pair<ReadRequest, int64_t>> done_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

Result<std::unique_ptr<BlockReader>> BlockReader::open(const std::vector<std::string>& paths,
                                                       const BlockReaderOptions& options) {
  std::unique_ptr<BlockReader> reader;
  if (options.io_uring) {
    int err = 0;
    reader = UringReader::create(options.queue_depth, &err);
    if (!reader)
      CEDAR_LOG_WARN("io_uring is not available here (%s); streaming reads use a pread thread pool instead",
                     std::strerror(err));
  }
  if (!reader) reader = std::make_unique<PreadReader>(options.pool_threads);
  // Room for a burst of queued reads up front, so that steady-state streaming never grows it.
  reader->queued_.reserve(4096);
  for (const std::string& p : paths) {
    File f;
    f.path = p;
    if (options.direct) {
      f.fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
      f.direct = f.fd >= 0;
    }
    if (f.fd < 0) f.fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);  // the filesystem refused O_DIRECT
    if (f.fd < 0) {
      const int e = errno;
      return io_error("cannot open " + p + " for streaming reads", e);
    }
    reader->files_.push_back(std::move(f));
  }
  return reader;
}

}  // namespace cedar::io
