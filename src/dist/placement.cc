#include "dist/placement.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include "model/model.h"
#include "spec/weight_inventory.h"

namespace cedar::dist {

std::vector<int> routed_experts_per_layer(const model::ModelConfig& c, const model::LayerPlan& plan) {
  std::vector<int> n(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) n[l] = plan.layers[l].n_routed_experts;
  return n;
}

ExpertPlacement place_experts(std::span<const int> experts_per_layer, int n_ranks, std::span<const uint32_t> load) {
  ExpertPlacement p;
  p.n_ranks = std::max(1, n_ranks);
  p.layer_base.assign(experts_per_layer.size() + 1, 0);
  for (size_t l = 0; l < experts_per_layer.size(); ++l) p.layer_base[l + 1] = p.layer_base[l] + experts_per_layer[l];
  p.owner.assign(p.layer_base.back(), 0);
  p.from_stats = load.size() == p.owner.size() && std::any_of(load.begin(), load.end(), [](uint32_t v) { return v; });
  std::vector<int> order;
  std::vector<uint64_t> rank_load(p.n_ranks);
  std::vector<int> rank_count(p.n_ranks);
  for (size_t l = 0; l < experts_per_layer.size(); ++l) {
    const int E = experts_per_layer[l], base = p.layer_base[l];
    const int cap = (E + p.n_ranks - 1) / p.n_ranks;
    order.resize(E);
    std::iota(order.begin(), order.end(), 0);
    // Heaviest first; +1 so that experts never routed still count (and ties keep id order).
    auto weight = [&](int e) -> uint64_t { return p.from_stats ? uint64_t{load[base + e]} + 1 : 1; };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight(a) > weight(b); });
    std::fill(rank_load.begin(), rank_load.end(), 0);
    std::fill(rank_count.begin(), rank_count.end(), 0);
    for (int e : order) {
      int best = -1;
      for (int r = 0; r < p.n_ranks; ++r)
        if (rank_count[r] < cap && (best < 0 || rank_load[r] < rank_load[best])) best = r;
      p.owner[base + e] = best;
      rank_load[best] += weight(e);
      rank_count[best] += 1;
    }
  }
  return p;
}

std::vector<uint32_t> read_expert_stats(const std::string& path, std::span<const int> experts_per_layer) {
  // The sidecar's format (model/streaming_source.cc): "CEDRST01", u32 layers, u32 experts, u32 counts.
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t n = static_cast<size_t>(std::accumulate(experts_per_layer.begin(), experts_per_layer.end(), 0));
  uint32_t hdr[2] = {};
  if (b.size() != 16 + 4 * n || std::memcmp(b.data(), "CEDRST01", 8) != 0) return {};
  std::memcpy(hdr, b.data() + 8, 8);
  if (hdr[0] != experts_per_layer.size() || hdr[1] != n) return {};
  std::vector<uint32_t> counts(n);
  std::memcpy(counts.data(), b.data() + 16, 4 * n);
  return counts;
}

std::vector<RankPlan> plan_ranks(const model::ModelConfig& c, const model::LayerPlan& plan, const ExpertPlacement& p,
                                 std::span<const uint32_t> load) {
  std::vector<RankPlan> ranks(p.n_ranks);
  for (const model::WeightSpec& w : model::weight_inventory(c)) {
    int layer = -1, expert = -1;
    if (model::parse_routed_expert_name(w.name, &layer, &expert) && layer < c.n_layers) {
      RankPlan& r = ranks[p.owner_of(layer, expert)];
      r.expert_bytes += w.n_bytes;
      if (w.name.ends_with(".w1.weight")) r.experts += 1;
    } else {
      ranks[0].other_bytes += w.n_bytes;
    }
  }
  const bool weighted = load.size() == p.owner.size();
  const double dim_bytes = 4.0 * c.dim, x_bytes = 2.0 * c.dim;  // fp32 outputs back; bf16 activations out
  std::vector<double> share(p.n_ranks);
  for (int l = 0; l < c.n_layers; ++l) {
    const int E = plan.layers[l].n_routed_experts, K = plan.layers[l].n_activated_experts, base = p.layer_base[l];
    double total = 0;
    std::fill(share.begin(), share.end(), 0.0);
    for (int e = 0; e < E; ++e) {
      const double wgt = weighted ? load[base + e] + 1.0 : 1.0;
      share[p.owner[base + e]] += wgt;
      total += wgt;
    }
    for (int r = 0; r < p.n_ranks; ++r) {
      const double s = share[r] / total, rows = K * s;
      ranks[r].load_share += s / c.n_layers;
      if (r == 0) continue;
      // A token touches rank r unless all K choices miss it (choices treated as independent).
      const double touched = 1.0 - std::pow(1.0 - s, K);
      ranks[r].send_bytes_per_token += touched * (20 + x_bytes) + rows * 16;
      ranks[r].recv_bytes_per_token += rows * dim_bytes;
    }
  }
  return ranks;
}

std::string describe_plan(const ExpertPlacement& p, std::span<const RankPlan> ranks) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "expert parallel: %d ranks, placement %s; Engram tables and dense weights on rank 0\n",
                p.n_ranks, p.from_stats ? "balanced by the expert-stats sidecar" : "by id (no expert statistics)");
  os << line;
  os << "  rank  experts  expert GiB  other GiB  routed work  decode bytes/token sent  received\n";
  double sent = 0, received = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankPlan& k = ranks[r];
    std::snprintf(line, sizeof line, "  %4zu  %7lld  %10.3f  %9.3f  %10.1f%%  %23.0f  %8.0f\n", r,
                  static_cast<long long>(k.experts), k.expert_bytes / 1073741824.0, k.other_bytes / 1073741824.0,
                  100.0 * k.load_share, k.send_bytes_per_token, k.recv_bytes_per_token);
    os << line;
    sent += k.send_bytes_per_token;
    received += k.recv_bytes_per_token;
  }
  std::snprintf(line, sizeof line, "  per decoded token the head sends %.0f bytes and receives %.0f bytes in all\n", sent,
                received);
  os << line;
  return os.str();
}

}  // namespace cedar::dist
