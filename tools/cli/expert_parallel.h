// --expert-parallel: a command run under mpirun with the routed experts spread over the ranks
// (docs/DISTRIBUTED.md). Rank 0 runs the command (the head); every other rank only loads its share
// of the experts and serves the head's requests until the head stops it.
#pragma once

#include <memory>
#include <string>

#include "args.h"
#include "cedar/status.h"
#include "dist/cluster.h"
#include "cedar/model.h"

namespace cedar::cli {

inline constexpr const char* kExpertParallelFlags[] = {"--exchange-timeout"};
inline constexpr const char* kExpertParallelUsage =
    "  --expert-parallel      under mpirun: every rank computes a share of the routed experts, rank 0 runs\n"
    "                         the command (docs/DISTRIBUTED.md)\n"
    "  --exchange-timeout S   with --expert-parallel: seconds a rank may take to answer before the head\n"
    "                         fails naming it (default 30)\n";

// The head's side of the job while its command runs: keep it alive until the model is gone. Its end
// stops the workers, or aborts the whole job when an exchange failed (a rank died or hung).
class ExpertParallelHead {
 public:
  explicit ExpertParallelHead(std::unique_ptr<dist::Cluster> cluster, dist::ExpertPlacement placement)
      : cluster_(std::move(cluster)), placement_(std::move(placement)) {}
  // Reports the exchange's totals, then ends the job (Cluster's destructor).
  ~ExpertParallelHead();
  // Installs the exchange on the head's model.
  void attach(model::Model& m) { m.set_expert_exchange(&cluster_->exchange(placement_, m.config().dim)); }
  const dist::ExpertPlacement& placement() const { return placement_; }

 private:
  std::unique_ptr<dist::Cluster> cluster_;
  dist::ExpertPlacement placement_;
};

// Without --expert-parallel: nullptr, nothing changes. With it: joins the MPI job, checks that every
// rank has the same checkpoint and settings, and places the experts. On a worker rank it does not
// return: the rank serves the head and exits. On the head it sets mopts->expert_filter to the head's
// share and returns the session; the caller loads the model and calls attach().
Result<std::unique_ptr<ExpertParallelHead>> start_expert_parallel(const Args& args, const std::string& dir,
                                                                  model::ModelOptions* mopts, bool budget_given);

}  // namespace cedar::cli
