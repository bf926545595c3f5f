#include "residency_flags.h"

#include <cstdio>

#include "model/residency_plan.h"

namespace cedar::cli {

Status residency_from_flags(const Args& args, const std::string& model_dir, model::ResidencyOptions* out,
                            bool* auto_budget) {
  if (auto_budget) *auto_budget = !args.has("--memory-budget");
  if (args.has("--memory-budget")) {
    CEDAR_ASSIGN_OR_RETURN(out->memory_budget, model::parse_size(*args.get("--memory-budget"), "--memory-budget"));
  } else if (!auto_budget) {
    out->memory_budget = model::default_memory_budget(0);
  }
  const std::string stats = args.get_or("--residency-stats", model_dir + "/.cedar-expert-stats");
  out->stats_file = stats == "none" ? "" : stats;
  return {};
}

void print_residency_line(const model::Model& m) {
  if (!m.streaming()) return;
  const model::ResidencyPlan& p = m.residency_plan();
  std::fprintf(stderr, "streaming: budget %.1f GiB, %lld of %lld experts resident, %lld Engram rows cached\n",
               p.budget / 1073741824.0, static_cast<long long>(p.expert_slots), static_cast<long long>(p.n_experts),
               static_cast<long long>(p.engram_slots));
}

}  // namespace cedar::cli
