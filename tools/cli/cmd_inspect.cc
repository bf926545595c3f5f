// cedar inspect: config summary, layer plan, parameter counts and memory plan of a model directory
// (every tensor mapped and checked against the inventory) or of a config.json alone.
#include <cstdio>
#include <optional>

#include "args.h"
#include "command.h"
#include "dist/placement.h"
#include "cedar/checkpoint.h"
#include "spec/config.h"
#include "spec/layer_plan.h"
#include "model_summary.h"
#include "cedar/model.h"
#include "spec/weight_inventory.h"
#include "weights/weight_map.h"
#include "progress.h"

namespace cedar::cli {
namespace {

constexpr const char* kUsage =
    "usage: cedar inspect (-m DIR | --config FILE) [--json] [--verify-data] [--memory-budget SIZE]\n"
    "  -m, --model DIR   a checkpoint directory (config.json + safetensors shards)\n"
    "  --config FILE     a config.json alone (no weights needed)\n"
    "  --json            print the summary as JSON\n"
    "  --verify-data     with -m: also read every tensor byte once (slow on big models)\n"
    "  --memory-budget SIZE  also print the residency plan for a machine with SIZE of RAM for weights\n"
    "                    (e.g. 64G): what stays resident, what streams, SSD bytes per token\n"
    "  --kv-reserve SIZE with --memory-budget: KV memory kept beside the weights (default 0)\n"
    "  --expert-parallel N  also print the plan of N expert-parallel ranks (docs/DISTRIBUTED.md): routed\n"
    "                    experts and bytes each rank maps, its share of the work, decode traffic per token\n"
    "  --residency-stats PATH  with --expert-parallel: the expert statistics that balance the placement\n"
    "                    (default DIR/.cedar-expert-stats when present)\n";

int cmd_inspect(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--model", "--config", "--memory-budget", "--kv-reserve", "--expert-parallel", "--residency-stats"}, {"--json", "--verify-data", "--help"}, {{"-m", "--model"}});
  if (!args.ok()) {
    std::fprintf(stderr, "cedar inspect: %s\n%s", args.status().message().c_str(), kUsage);
    return 2;
  }
  if (args->has("--help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (args->has("--model") == args->has("--config")) {
    std::fprintf(stderr, "cedar inspect: give exactly one of -m DIR or --config FILE\n%s", kUsage);
    return 2;
  }
  const std::string config_path =
      args->has("--model") ? *args->get("--model") + "/config.json" : *args->get("--config");
  auto config = model::load_config(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "cedar inspect: %s\n", config.status().message().c_str());
    return 1;
  }
  const model::LayerPlan plan = model::make_layer_plan(*config);
  const auto inventory = model::weight_inventory(*config);
  const model::ParamCounts counts = model::count_params(inventory);
  std::optional<model::ResidencyPlan> residency;
  if (args->has("--memory-budget")) {
    auto budget = model::parse_size(*args->get("--memory-budget"), "--memory-budget");
    model::ResidencyPlanOptions po;
    if (args->has("--kv-reserve")) {
      auto kv = model::parse_size(*args->get("--kv-reserve"), "--kv-reserve");
      if (!kv.ok()) {
        std::fprintf(stderr, "cedar inspect: %s\n", kv.status().message().c_str());
        return 2;
      }
      po.kv_reserve_bytes = *kv;
    }
    if (!budget.ok()) {
      std::fprintf(stderr, "cedar inspect: %s\n", budget.status().message().c_str());
      return 2;
    }
    auto p = model::plan_residency(*config, plan, counts, *budget, po);
    if (!p.ok()) {
      std::fprintf(stderr, "cedar inspect: %s\n", p.status().message().c_str());
      return 1;
    }
    residency = *p;
  }

  std::string expert_plan;
  if (args->has("--expert-parallel")) {
    auto n = args->get_int("--expert-parallel", 1);
    if (!n.ok() || *n < 1 || *n > 1024) {
      std::fprintf(stderr, "cedar inspect: --expert-parallel takes a rank count between 1 and 1024\n");
      return 2;
    }
    const std::vector<int> per_layer = dist::routed_experts_per_layer(*config, plan);
    std::string stats = args->get_or("--residency-stats", "");
    if (stats.empty() && args->has("--model")) stats = *args->get("--model") + "/.cedar-expert-stats";
    const std::vector<uint32_t> load = stats.empty() ? std::vector<uint32_t>() : dist::read_expert_stats(stats, per_layer);
    const dist::ExpertPlacement placement = dist::place_experts(per_layer, static_cast<int>(*n), load);
    expert_plan = dist::describe_plan(placement, dist::plan_ranks(*config, plan, placement, load));
  }
  if (args->has("--model")) {
    ProgressBar bar("mapping checkpoint");
    io::CheckpointOptions opts;
    opts.read_all_data = args->has("--verify-data");
    opts.progress = [&](const io::CheckpointProgress& p) {
      bar.update(p.bytes_done, p.bytes_total, std::string(p.current_file));
    };
    auto ckpt = io::Checkpoint::open(*args->get("--model"), opts);
    bar.finish();
    if (!ckpt.ok()) {
      std::fprintf(stderr, "cedar inspect: %s\n", ckpt.status().message().c_str());
      return 1;
    }
    auto weights = model::WeightMap::bind(*ckpt, inventory);
    if (!weights.ok()) {
      std::fprintf(stderr, "cedar inspect: %s\n", weights.status().message().c_str());
      return 1;
    }
    if (!args->has("--json"))
      std::printf("checkpoint: %s: %zu tensors in %zu shard(s), %.1f MiB, all match the inventory\n\n",
                  ckpt->dir().c_str(), ckpt->tensor_count(), ckpt->shards().size(), ckpt->total_bytes() / 1048576.0);
  }
  if (args->has("--json")) {
    nlohmann::json j = model::summary_json(*config, plan, counts);
    if (residency) j["residency"] = model::residency_plan_json(*residency);
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", model::summary_text(*config, plan, counts).c_str());
    if (residency) std::printf("\n%s", model::residency_plan_text(*residency).c_str());
    if (!expert_plan.empty()) std::printf("\n%s", expert_plan.c_str());
  }
  return 0;
}

}  // namespace

CEDAR_COMMAND("inspect", "print the config, layer plan, parameter counts and memory plan", cmd_inspect);

}  // namespace cedar::cli
