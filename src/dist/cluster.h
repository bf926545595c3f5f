// Cluster: this process's place in an expert-parallel job launched by mpirun (docs/DISTRIBUTED.md).
// It owns the MPI world: init with errors returned (MPI_ERRORS_RETURN, never MPI's abort-on-error),
// every exchange nonblocking and polled against a deadline, so that a dead, hung or unreachable rank
// makes the head fail with a message naming the rank and its host instead of hanging.
//
// Life of a job: join() on every rank; agree() on the checkpoint and settings (a mismatch is refused
// on every rank); share_placement() (the head's plan reaches every rank); then the head runs the model
// with exchange() installed and calls finish(true) at the end (the workers' loops stop), while every
// worker serves the exchange until then. Any failure: finish(false) tears the whole job down.
// MPI's headers stay inside this module.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>
#include <string>

#include "core/status.h"
#include "dist/placement.h"
#include "model/expert_exchange.h"

namespace cedar::dist {

// What the head's exchange did (printed at the end of a job; docs/DISTRIBUTED.md's measurements).
struct ExchangeCounters {
  bool failed = false;           // any exchange call returned an error
  uint64_t requests = 0;         // requests sent (one per remote rank and MoE layer with rows for it)
  uint64_t bytes_sent = 0, bytes_received = 0;
  double wait_seconds = 0;       // time the head spent waiting for replies (after its own experts)
};

struct ClusterOptions {
  double timeout_s = 30;  // the most any one exchange (start-up, a MoE layer's replies) may wait
};

class Cluster {
 public:
  static Result<std::unique_ptr<Cluster>> join(const ClusterOptions& options);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool head() const { return rank_ == 0; }
  const std::string& host(int rank) const { return hosts_[rank]; }
  std::string describe(int rank) const;  // "rank 2 (host foo)"

  // Every rank passes its checkpoint fingerprint and its settings (numerics, cedar version); all
  // ranks get the same error when any rank differs from rank 0, naming it.
  Status agree(const std::string& checkpoint_dir, const std::string& fingerprint, const std::string& settings);
  // Rank 0's placement, everywhere (other ranks' argument is replaced).
  Status share_placement(ExpertPlacement& placement);
  // The exchange over this world, for a model of hidden size `dim` (valid while the Cluster lives).
  model::ExpertExchange& exchange(const ExpertPlacement& placement, size_t dim);

  // True once any exchange call returned an error (the job cannot go on: a rank is gone).
  bool exchange_failed() const { return counters_ && counters_->failed; }
  ExchangeCounters counters() const { return counters_ ? *counters_ : ExchangeCounters{}; }

  // The end of the job. ok on the head: the workers are told to stop, then this rank finalises;
  // !ok (any rank): the whole job is aborted with exit code 1 (a dead or hung rank cannot finalise).
  void finish(bool ok);
  Status stop_workers();

 private:
  Cluster() = default;
  int rank_ = 0, size_ = 1;
  double timeout_s_ = 30;
  std::vector<std::string> hosts_;
  std::unique_ptr<model::ExpertExchange> exchange_;
  std::shared_ptr<ExchangeCounters> counters_;
  bool finished_ = false;
};

// FNV-1a 64 of config.json and of every *.safetensors file's name, size, header and 16 samples of
// 4 KiB of its data (not all of it: fast on the 475 GiB release), as hex. Empty when DIR cannot be read.
std::string checkpoint_fingerprint(const std::string& dir);

}  // namespace cedar::dist
