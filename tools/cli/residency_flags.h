// --memory-budget and --residency-stats, shared by every command that loads a model.
#pragma once

#include <string>

#include "args.h"
#include "cedar/status.h"
#include "cedar/model.h"

namespace cedar::cli {

inline constexpr const char* kResidencyUsage =
    "  --memory-budget SIZE   RAM for weights, e.g. 64G (default: what the machine can spare beside the\n"
    "                         KV budget); what does not fit streams from the SSD (docs/STREAMING.md)\n"
    "  --residency-stats PATH routing statistics for warm restarts when streaming (default:\n"
    "                         DIR/.cedar-expert-stats, or ~/.cache/cedar/ when DIR is read-only; 'none')\n";

// Fills `out` from the flags. With no --memory-budget: when `auto_budget` is given it is set to true
// and the caller picks the default beside its KV budget; otherwise the budget is MemAvailable.
Status residency_from_flags(const Args& args, const std::string& model_dir, model::ResidencyOptions* out,
                            bool* auto_budget = nullptr);

// Prints the plan's one-line summary to stderr when the model streams.
void print_residency_line(const model::Model& m);

}  // namespace cedar::cli
