// Which rank owns which routed expert (expert parallelism, docs/DISTRIBUTED.md). Pure arithmetic, no
// MPI: `cedar inspect --expert-parallel N` prints the same plan a job would run.
//
// Per layer, experts are dealt heaviest first to the rank with the least expected load so far, each
// rank taking at most ceil(E / N) experts (so that no rank maps more than its share of the bytes).
// The load is the routing count of the expert-stats sidecar when one for this model is present
// (docs/STREAMING.md), else every expert weighs the same and the deal is by id (expert e -> e mod N).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "spec/config.h"
#include "spec/layer_plan.h"

namespace cedar::dist {

struct ExpertPlacement {
  int n_ranks = 1;
  std::vector<int32_t> layer_base;  // [n_layers + 1] first index of each layer's experts in owner
  std::vector<int32_t> owner;       // [total routed experts] the owning rank
  bool from_stats = false;          // balanced by the sidecar's routing counts
  int owner_of(int layer, int expert) const { return owner[layer_base[layer] + expert]; }
};

// experts_per_layer: the backbone's routed experts per layer; load: one count per expert in layer
// order (empty: uniform).
ExpertPlacement place_experts(std::span<const int> experts_per_layer, int n_ranks, std::span<const uint32_t> load);

// The routing counts of the sidecar at `path` when it belongs to a model of these shapes; empty when
// the file is absent or is for another model (the placement then deals by id).
std::vector<uint32_t> read_expert_stats(const std::string& path, std::span<const int> experts_per_layer);

std::vector<int> routed_experts_per_layer(const model::ModelConfig& c, const model::LayerPlan& plan);

// The per-rank plan: routed-expert bytes mapped, expected share of the routed work, and the bytes a
// decoded token sends to / receives from each rank (a 20-byte header and the bf16 activation once per
// rank it touches, 16 bytes and a returned fp32 row per (token, expert)). Dense weights and Engram
// tables stay on the head.
struct RankPlan {
  int64_t experts = 0, expert_bytes = 0;
  int64_t other_bytes = 0;  // dense weights, Engram tables, DSpark stages (head only)
  double load_share = 0;    // expected fraction of the routed (token, expert) rows
  double send_bytes_per_token = 0, recv_bytes_per_token = 0;  // head <-> this rank, decode
};
std::vector<RankPlan> plan_ranks(const model::ModelConfig& c, const model::LayerPlan& plan, const ExpertPlacement& p,
                                 std::span<const uint32_t> load);
std::string describe_plan(const ExpertPlacement& p, std::span<const RankPlan> ranks);

}  // namespace cedar::dist
