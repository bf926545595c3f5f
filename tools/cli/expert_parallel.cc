#include "expert_parallel.h"

#include <cstdio>
#include <cstdlib>

#include "cedar/platform.h"
#include "spec/layer_plan.h"

namespace cedar::cli {
namespace {

// A worker rank's life: its experts mapped, requests served until the head says stop.
[[noreturn]] void run_worker(std::unique_ptr<dist::Cluster> cluster, const dist::ExpertPlacement& placement,
                             const std::string& dir, model::ModelOptions mopts, int threads) {
  const int rank = cluster->rank();
  mopts.experts_only = true;
  mopts.expert_filter = [&placement, rank](int l, int e) { return placement.owner_of(l, e) == rank; };
  mopts.progress = nullptr;
  // The command's --threads, as on the head (ranks sharing a machine should share its cores).
  if (threads > 0) ThreadPool::set_default_threads(threads);
  auto model = model::Model::load(dir, mopts);
  Status st = model.ok() ? (*model)->serve_experts(cluster->exchange(placement, (*model)->config().dim),
                                                   &ThreadPool::global())
                         : model.status();
  if (!st.ok()) std::fprintf(stderr, "cedar: expert parallel %s: %s\n", cluster->describe(rank).c_str(), st.message().c_str());
  model = Status();  // unmaps before MPI finalises
  cluster->finish(st.ok());
  cluster.reset();
  std::exit(st.ok() ? 0 : 1);
}

}  // namespace

ExpertParallelHead::~ExpertParallelHead() {
  const dist::ExchangeCounters c = cluster_->counters();
  if (!c.failed)
    std::fprintf(stderr, "expert exchange: %llu requests, %.1f KiB sent, %.1f KiB received, %.3f s waiting for replies\n",
                 static_cast<unsigned long long>(c.requests), c.bytes_sent / 1024.0, c.bytes_received / 1024.0,
                 c.wait_seconds);
}

Result<std::unique_ptr<ExpertParallelHead>> start_expert_parallel(const Args& args, const std::string& dir,
                                                                  model::ModelOptions* mopts, bool budget_given) {
  if (!args.has("--expert-parallel")) {
    if (args.has("--exchange-timeout")) return invalid_argument("--exchange-timeout needs --expert-parallel");
    return std::unique_ptr<ExpertParallelHead>();
  }
  auto timeout = args.get_double("--exchange-timeout", 30.0);
  if (!timeout.ok()) return timeout.status();
  if (!(*timeout > 0)) return invalid_argument("--exchange-timeout must be > 0 seconds");
  // Every rank maps its share; a budget would plan the whole model's residency (not per share).
  if (budget_given)
    return unimplemented("--expert-parallel with --memory-budget is not implemented: each rank maps its share of "
                         "the routed experts (drop --memory-budget, or add ranks until the shares fit)");
  mopts->residency.memory_budget = 0;
  dist::ClusterOptions co;
  co.timeout_s = *timeout;
  CEDAR_ASSIGN_OR_RETURN(std::unique_ptr<dist::Cluster> cluster, dist::Cluster::join(co));
  auto fail_all = [&](Status st) -> Status {
    // Every rank found the same problem, or one is gone: say it once (the head), tear the job down.
    if (cluster->head()) std::fprintf(stderr, "cedar: %s\n", st.message().c_str());
    cluster->finish(false);
    return st;
  };
  // The config decides the placement's shapes; the fingerprint, that all ranks read the same weights.
  auto config = model::load_config(dir + "/config.json");
  const std::string fingerprint = config.ok() ? dist::checkpoint_fingerprint(dir) : "";
  const std::string settings =
      std::string("cedar 0.1.0 exchange 1, numerics ") + (mopts->numerics == ops::Numerics::kExact ? "exact" : "fast");
  if (Status st = cluster->agree(dir, fingerprint, settings); !st.ok()) return fail_all(st);
  if (!config.ok()) return fail_all(config.status());
  const model::LayerPlan plan = model::make_layer_plan(*config);
  const std::vector<int> per_layer = dist::routed_experts_per_layer(*config, plan);
  dist::ExpertPlacement placement;
  if (cluster->head()) {
    const std::vector<uint32_t> load = mopts->residency.stats_file.empty()
                                           ? std::vector<uint32_t>()
                                           : dist::read_expert_stats(mopts->residency.stats_file, per_layer);
    placement = dist::place_experts(per_layer, cluster->size(), load);
  }
  if (Status st = cluster->share_placement(placement); !st.ok()) return fail_all(st);
  if (!cluster->head()) {
    auto threads = args.get_int("--threads", 0);
    run_worker(std::move(cluster), placement, dir, *mopts, threads.ok() ? static_cast<int>(*threads) : 0);
  }
  std::fprintf(stderr, "expert parallel: %d ranks (%s), placement %s, exchange timeout %.1f s\n", cluster->size(),
               cluster->describe(0).c_str(), placement.from_stats ? "from the expert statistics" : "by id", *timeout);
  auto head = std::make_unique<ExpertParallelHead>(std::move(cluster), placement);
  const dist::ExpertPlacement* p = &head->placement();
  mopts->expert_filter = [p](int l, int e) { return p->owner_of(l, e) == 0; };
  return head;
}

}  // namespace cedar::cli
