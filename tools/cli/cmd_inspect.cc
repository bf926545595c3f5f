// cedar inspect: config summary, layer plan, parameter counts and memory plan of a model directory
// (every tensor mapped and checked against the inventory) or of a config.json alone.
#include <cstdio>

#include "args.h"
#include "command.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/layer_plan.h"
#include "model/model_summary.h"
#include "model/weight_inventory.h"
#include "model/weight_map.h"
#include "progress.h"

namespace cedar::cli {
namespace {

constexpr const char* kUsage =
    "usage: cedar inspect (-m DIR | --config FILE) [--json] [--verify-data]\n"
    "  -m, --model DIR   a checkpoint directory (config.json + safetensors shards)\n"
    "  --config FILE     a config.json alone (no weights needed)\n"
    "  --json            print the summary as JSON\n"
    "  --verify-data     with -m: also read every tensor byte once (slow on big models)\n";

int cmd_inspect(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--model", "--config"}, {"--json", "--verify-data", "--help"}, {{"-m", "--model"}});
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
    std::printf("%s\n", model::summary_json(*config, plan, counts).dump(2).c_str());
  } else {
    std::printf("%s", model::summary_text(*config, plan, counts).c_str());
  }
  return 0;
}

}  // namespace

CEDAR_COMMAND("inspect", "print the config, layer plan, parameter counts and memory plan", cmd_inspect);

}  // namespace cedar::cli
