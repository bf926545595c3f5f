#include "dist/cluster.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "dist/mpi_internal.h"

namespace cedar::dist {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

Status wait_bounded(std::span<MPI_Request> requests, const std::function<int(size_t)>& peer, double timeout_s,
                    const std::string& what, const std::function<std::string(int)>& describe) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(timeout_s);
  // Spin briefly (a reply is usually there within microseconds on a fast link), then sleep in growing
  // steps: ranks often share cores, and a spinning waiter would slow down the rank it waits for.
  int polls = 0;
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      MPI_Status st;
      const int rc = MPI_Test(&requests[i], &done, &st);
      if (rc != MPI_SUCCESS)
        return Status(StatusCode::kIo, describe(peer(i)) + " failed during " + what + ": " + mpi_error_text(rc) +
                                           " (the rank died or its host is unreachable)");
      if (!done) all = false;
    }
    if (all) return {};
    if (clock::now() > deadline) {
      for (size_t i = 0; i < requests.size(); ++i)
        if (requests[i] != MPI_REQUEST_NULL) {
          char secs[32];
          std::snprintf(secs, sizeof secs, "%.1f", timeout_s);
          return Status(StatusCode::kIo, describe(peer(i)) + " did not answer within " + secs + " s during " + what +
                                             ": it died, hung or is unreachable (--exchange-timeout sets the bound)");
        }
      return {};
    }
    if (++polls > 64) {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }
}

Result<std::unique_ptr<Cluster>> Cluster::join(const ClusterOptions& options) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return failed_precondition("expert parallel: MPI is already initialised in this process");
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
    return internal_error("expert parallel: MPI_Init_thread failed (is this run under mpirun?)");
  // Errors come back as codes: a peer's death must become a message and a clean exit, not MPI's abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::unique_ptr<Cluster> c(new Cluster());
  c->timeout_s_ = options.timeout_s;
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size_);
  if (provided < MPI_THREAD_SERIALIZED)
    return failed_precondition("expert parallel: this MPI library does not support calls from the engine's thread "
                               "(MPI_THREAD_SERIALIZED); use Open MPI from Debian (libopenmpi-dev)");
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  constexpr int kHost = 64;
  std::vector<char> mine(kHost, 0), all(static_cast<size_t>(kHost) * c->size_, 0);
  std::memcpy(mine.data(), name, std::min(len, kHost - 1));
  MPI_Request req = MPI_REQUEST_NULL;
  if (int rc = MPI_Iallgather(mine.data(), kHost, MPI_CHAR, all.data(), kHost, MPI_CHAR, MPI_COMM_WORLD, &req);
      rc != MPI_SUCCESS)
    return internal_error("expert parallel: exchanging host names failed: " + mpi_error_text(rc));
  CEDAR_RETURN_IF_ERROR(wait_bounded(
      {&req, 1}, [](size_t) { return -1; }, c->timeout_s_, "the start-up (host names)",
      [](int) { return std::string("a rank of the job"); }));
  for (int r = 0; r < c->size_; ++r) c->hosts_.emplace_back(all.data() + static_cast<size_t>(r) * kHost);
  return c;
}

Cluster::~Cluster() { finish(!exchange_failed()); }

std::string Cluster::describe(int rank) const {
  if (rank < 0 || rank >= size_) return "a rank of the job";
  return "rank " + std::to_string(rank) + " (host " + hosts_[rank] + ")";
}

Status Cluster::agree(const std::string& checkpoint_dir, const std::string& fingerprint, const std::string& settings) {
  // Fixed-size records: the fingerprint, the settings and the directory (for the message).
  constexpr size_t kField = 128, kRecord = 3 * kField;
  std::vector<char> mine(kRecord, 0), all(kRecord * size_, 0);
  auto put = [&](size_t field, const std::string& s) {
    std::memcpy(mine.data() + field * kField, s.data(), std::min(s.size(), kField - 1));
  };
  put(0, fingerprint);
  put(1, settings);
  put(2, checkpoint_dir.size() < kField ? checkpoint_dir : "..." + checkpoint_dir.substr(checkpoint_dir.size() - 100));
  MPI_Request req = MPI_REQUEST_NULL;
  if (int rc = MPI_Iallgather(mine.data(), kRecord, MPI_CHAR, all.data(), kRecord, MPI_CHAR, MPI_COMM_WORLD, &req);
      rc != MPI_SUCCESS)
    return internal_error("expert parallel: the start-up agreement failed: " + mpi_error_text(rc));
  CEDAR_RETURN_IF_ERROR(wait_bounded(
      {&req, 1}, [](size_t) { return -1; }, timeout_s_, "the start-up agreement (checkpoint and settings)",
      [this](int r) { return describe(r); }));
  auto field = [&](int r, size_t f) { return std::string(all.data() + r * kRecord + f * kField); };
  for (int r = 1; r < size_; ++r) {
    if (field(r, 0).empty() || field(r, 0) != field(0, 0))
      return failed_precondition("expert parallel: " + describe(r) + " has another checkpoint than " + describe(0) +
                                 ": " + field(r, 2) + " (fingerprint " + field(r, 0) + ") vs " + field(0, 2) +
                                 " (fingerprint " + field(0, 0) + "); every rank must load the same checkpoint");
    if (field(r, 1) != field(0, 1))
      return failed_precondition("expert parallel: " + describe(r) + " runs with other settings than " + describe(0) +
                                 ": '" + field(r, 1) + "' vs '" + field(0, 1) +
                                 "'; every rank needs the same cedar version and --numerics");
  }
  return {};
}

Status Cluster::share_placement(ExpertPlacement& p) {
  // The head's sidecar decides: other hosts may have other statistics, or none.
  int32_t hdr[3] = {p.n_ranks, static_cast<int32_t>(p.layer_base.size()), static_cast<int32_t>(p.owner.size())};
  MPI_Request req = MPI_REQUEST_NULL;
  auto bcast = [&](void* data, int count, MPI_Datatype type, const char* what) -> Status {
    if (int rc = MPI_Ibcast(data, count, type, 0, MPI_COMM_WORLD, &req); rc != MPI_SUCCESS)
      return internal_error(std::string("expert parallel: sharing the placement failed: ") + mpi_error_text(rc));
    return wait_bounded({&req, 1}, [](size_t) { return 0; }, timeout_s_, what, [this](int r) { return describe(r); });
  };
  CEDAR_RETURN_IF_ERROR(bcast(hdr, 3, MPI_INT32_T, "the start-up (placement)"));
  if (!head()) {
    p.n_ranks = hdr[0];
    p.layer_base.assign(hdr[1], 0);
    p.owner.assign(hdr[2], 0);
  }
  int32_t stats = p.from_stats;
  CEDAR_RETURN_IF_ERROR(bcast(&stats, 1, MPI_INT32_T, "the start-up (placement)"));
  CEDAR_RETURN_IF_ERROR(bcast(p.layer_base.data(), hdr[1], MPI_INT32_T, "the start-up (placement)"));
  CEDAR_RETURN_IF_ERROR(bcast(p.owner.data(), hdr[2], MPI_INT32_T, "the start-up (placement)"));
  p.from_stats = stats != 0;
  if (p.n_ranks != size_)
    return failed_precondition("expert parallel: the placement is for " + std::to_string(p.n_ranks) +
                               " ranks but the job has " + std::to_string(size_));
  return {};
}

model::ExpertExchange& Cluster::exchange(const ExpertPlacement& placement, size_t dim) {
  counters_ = std::make_shared<ExchangeCounters>();
  exchange_ = make_mpi_exchange(rank_, size_, placement, dim, timeout_s_, [this](int r) { return describe(r); },
                                counters_);
  return *exchange_;
}

Status Cluster::stop_workers() {
  if (!head() || size_ == 1) return {};
  // A request for layer -1 is the stop message.
  int32_t stop[4] = {-1, 0, 0, 0};
  std::vector<MPI_Request> reqs(size_ - 1, MPI_REQUEST_NULL);
  for (int r = 1; r < size_; ++r)
    if (int rc = MPI_Isend(stop, 4, MPI_INT32_T, r, kTagRequest, MPI_COMM_WORLD, &reqs[r - 1]); rc != MPI_SUCCESS)
      return Status(StatusCode::kIo, describe(r) + ": cannot send the stop message: " + mpi_error_text(rc));
  return wait_bounded(reqs, [](size_t i) { return static_cast<int>(i) + 1; }, timeout_s_, "the stop message",
                      [this](int r) { return describe(r); });
}

void Cluster::finish(bool ok) {
  if (finished_) return;
  finished_ = true;
  std::fflush(stdout);
  std::fflush(stderr);
  if (ok && head()) {
    Status st = stop_workers();
    if (!st.ok()) {
      std::fprintf(stderr, "cedar: expert parallel: %s\n", st.message().c_str());
      ok = false;
    }
  }
  if (!ok) MPI_Abort(MPI_COMM_WORLD, 1);  // tears down every rank, the dead or hung one included
  MPI_Finalize();
}

std::string checkpoint_fingerprint(const std::string& dir) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  auto mix_file_prefix = [&](const std::string& path, bool header_only) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) return false;
    const uint64_t size = static_cast<uint64_t>(in.tellg());
    mix(&size, sizeof size);
    in.seekg(0);
    uint64_t want = size;
    if (header_only) {  // safetensors: u64 header length, then the JSON header
      uint64_t len = 0;
      if (!in.read(reinterpret_cast<char*>(&len), 8)) return false;
      want = std::min<uint64_t>(size - 8, len);
    }
    std::vector<char> buf(std::min<uint64_t>(want, 64u << 20));
    if (!in.read(buf.data(), static_cast<std::streamsize>(buf.size()))) return false;
    mix(buf.data(), buf.size());
    if (!header_only) return true;
    // 16 samples of 4 KiB spread over the data: checkpoints of equal shapes but other weights differ.
    const uint64_t data0 = 8 + want, data_bytes = size - data0;
    std::vector<char> sample(4096);
    for (int i = 0; i < 16 && data_bytes > 0; ++i) {
      const uint64_t at = data0 + data_bytes / 16 * i;
      const uint64_t n = std::min<uint64_t>(sample.size(), size - at);
      in.seekg(static_cast<std::streamoff>(at));
      if (!in.read(sample.data(), static_cast<std::streamsize>(n))) return false;
      mix(sample.data(), n);
    }
    return true;
  };
  if (!mix_file_prefix(dir + "/config.json", false)) return "";
  std::vector<std::string> shards;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 12 && n.ends_with(".safetensors")) shards.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(shards.begin(), shards.end());
  for (const std::string& s : shards) {
    mix(s.data(), s.size());
    if (!mix_file_prefix(dir + "/" + s, true)) return "";
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

}  // namespace cedar::dist
