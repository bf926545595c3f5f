#include "residency_flags.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>

#include "cedar/model.h"

namespace cedar::cli {

namespace {

// DIR/.cedar-expert-stats when the model directory is writable, else a file under
// $XDG_CACHE_HOME/cedar (or ~/.cache/cedar) named after the directory: model directories are often
// read-only (a shared download), and the statistics are only a warm-start hint.
std::string default_stats_path(const std::string& model_dir) {
  if (::access(model_dir.c_str(), W_OK) == 0) return model_dir + "/.cedar-expert-stats";
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(model_dir, ec).lexically_normal().string();
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string base = xdg && *xdg ? std::string(xdg) : home && *home ? std::string(home) + "/.cache" : "/tmp";
  base += "/cedar";
  std::filesystem::create_directories(base, ec);
  char name[64];
  std::snprintf(name, sizeof name, "/expert-stats-%016zx", std::hash<std::string>{}(abs));
  return base + name;
}

}  // namespace

Status residency_from_flags(const Args& args, const std::string& model_dir, model::ResidencyOptions* out,
                            bool* auto_budget) {
  if (auto_budget) *auto_budget = !args.has("--memory-budget");
  if (args.has("--memory-budget")) {
    CEDAR_ASSIGN_OR_RETURN(out->memory_budget, model::parse_size(*args.get("--memory-budget"), "--memory-budget"));
  } else if (!auto_budget) {
    out->memory_budget = model::default_memory_budget(0);
  }
  const std::string stats =
      args.has("--residency-stats") ? *args.get("--residency-stats") : default_stats_path(model_dir);
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
