#include "weights/residency_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "ops/linear/bf16_coded.h"

namespace cedar::model {
namespace {

constexpr int64_t kAlign = 4096;
constexpr int64_t kGiB = int64_t{1} << 30;

std::string gib(double b) {
  char buf[32];
  if (b >= kGiB) std::snprintf(buf, sizeof buf, "%.1f GiB", b / kGiB);
  else if (b >= (1 << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  return buf;
}

int64_t engram_table_bytes(const ModelConfig& c) {
  int64_t rows = 0;
  for (int64_t r : c.engram_num_embeddings) rows += r;
  return rows * engram_row_bytes(c);
}

int64_t total_experts(const ModelConfig& c, const LayerPlan& plan) {
  int64_t n = 0;
  for (int l = 0; l < c.n_layers; ++l) n += plan.layers[l].n_routed_experts;
  return n;
}

// Everything the forward pass reads besides routed experts and Engram tables (the vision tower is
// mapped but not run; the DSpark stages are mapped and read only when a caller drafts, which the plan
// does not count yet: issue 36, item 5).
int64_t dense_resident_bytes(const ModelConfig& c, const ParamCounts& counts) {
  return counts.backbone_bytes - counts.routed_expert_bytes + counts.engram_bytes - engram_table_bytes(c);
}

// Activations and scratch: a few percent of the budget, at most 2 GiB (the released model's
// decode workspace is tens of MiB; a 512-token prefill chunk needs a few hundred).
int64_t workspace_reserve(int64_t budget) { return std::min<int64_t>(2 * kGiB, budget / 50); }

// The smallest budget B with B - workspace_reserve(B) >= `rest`. B - workspace_reserve(B) never
// decreases as B grows, so every larger budget (a rounded-up one) works too.
int64_t smallest_budget(int64_t rest) {
  int64_t b = rest;
  // Every step stays at or below the answer (workspace_reserve never decreases) and closes most of
  // the gap to it (the workspace is a fiftieth of the budget): a few steps.
  while (b - workspace_reserve(b) < rest) b = rest + workspace_reserve(b);
  return b;
}

}  // namespace

int64_t routed_expert_bytes(const ModelConfig& c) {
  const int64_t dim = c.dim, inter = c.moe_inter_dim;
  const int64_t w13 = inter * (dim / 2) + inter * (dim / 32);  // packed E2M1 + one E8M0 per 32
  const int64_t w2 = dim * (inter / 2) + dim * (inter / 32);
  return 2 * w13 + w2;
}

int64_t expert_slot_bytes(const ModelConfig& c) {
  // Six tensors, each read as its 4 KiB-aligned superset: at most two extra blocks each.
  return (routed_expert_bytes(c) + kAlign - 1) / kAlign * kAlign + 6 * 2 * kAlign;
}

int64_t engram_row_bytes(const ModelConfig& c) { return c.engram_head_dim + c.engram_head_dim / 32; }
int64_t engram_slot_bytes(const ModelConfig& c) { return (engram_row_bytes(c) + 63) / 64 * 64; }

ResidencyPlan resident_plan(const ModelConfig& c, const LayerPlan& plan, const ParamCounts& counts,
                            const ResidencyPlanOptions& options) {
  ResidencyPlan p;
  p.dense_bytes = dense_resident_bytes(c, counts);
  if (options.coded_head && ops::bf16_codable(static_cast<size_t>(c.dim))) {
    // 1.5 bytes per weight and a 16-byte table per row; blocks with rare high bytes add 132 bytes
    // each (the small preset's Gaussian head and cedar-mini's trained one have none: left out).
    p.coded_head_bytes = static_cast<int64_t>(
        ops::bf16_coded_base_bytes(static_cast<size_t>(c.vocab_size), static_cast<size_t>(c.dim)));
  }
  p.routed_expert_total = counts.routed_expert_bytes;
  p.engram_table_total = engram_table_bytes(c);
  p.n_experts = total_experts(c, plan);
  p.expert_slots = p.n_experts;
  p.expert_bytes = routed_expert_bytes(c);
  p.expert_slot = p.expert_bytes;
  p.expert_slab_bytes = p.routed_expert_total;
  p.engram_cache_bytes = p.engram_table_total;
  p.engram_rows_total = p.engram_table_total / std::max<int64_t>(1, engram_row_bytes(c));
  p.engram_slots = p.engram_rows_total;
  p.engram_rows_per_token =
      static_cast<int64_t>(c.engram_layer_ids.size()) * (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  p.budget = static_cast<uint64_t>(p.resident_total());
  return p;
}

Result<ResidencyPlan> plan_residency(const ModelConfig& c, const LayerPlan& plan, const ParamCounts& counts,
                                     uint64_t budget, const ResidencyPlanOptions& options) {
  ResidencyPlan p = resident_plan(c, plan, counts, options);
  p.budget = budget;
  p.kv_reserve_bytes = static_cast<int64_t>(options.kv_reserve_bytes);
  p.prefill_chunk = options.prefill_chunk;
  p.workspace_reserve = workspace_reserve(static_cast<int64_t>(budget));
  const int64_t fixed = p.dense_bytes + p.kv_reserve_bytes + p.workspace_reserve + p.coded_head_bytes;
  const int64_t everything = fixed + p.routed_expert_total + p.engram_table_total;
  if (static_cast<int64_t>(budget) >= everything) return p;  // fully resident: no streaming

  p.streaming = true;
  p.expert_slot = expert_slot_bytes(c);
  const int64_t n_active = plan.layers.empty() ? c.n_activated_experts : plan.layers[0].n_activated_experts;
  const int64_t engram_slot = engram_slot_bytes(c);
  // The smallest workable caches: one token's experts of one layer, and one token's Engram rows.
  const int64_t min_engram = p.engram_table_total > 0 ? std::max<int64_t>(p.engram_rows_per_token, 1024) * engram_slot : 0;
  const int64_t min_needed = fixed + n_active * p.expert_slot + min_engram;
  if (static_cast<int64_t>(budget) < min_needed) {
    // The workspace grows with the budget, so the budget that works is larger than min_needed here:
    // the smallest B with B - workspace(B) >= what the rest needs, rounded up to the unit named (a
    // figure with decimals could round below B).
    const int64_t works = smallest_budget(min_needed - p.workspace_reserve);
    const int64_t unit = works >= kGiB ? kGiB : int64_t{1} << 20;
    const int64_t rounded = (works + unit - 1) / unit * unit;
    return failed_precondition(
        "--memory-budget " + gib(static_cast<double>(budget)) + " cannot hold the dense weights (" + gib(p.dense_bytes) +
        ")" + (p.coded_head_bytes ? " plus the re-coded head (" + gib(p.coded_head_bytes) + ")" : std::string()) +
        (p.kv_reserve_bytes ? " plus the KV reserve (" + gib(p.kv_reserve_bytes) + ")" : std::string()) +
        " and the smallest streaming caches (" + gib(n_active * p.expert_slot + min_engram) +
        "); raise --memory-budget to at least " + std::to_string(rounded / unit) + (unit == kGiB ? "G" : "M"));
  }
  int64_t avail = static_cast<int64_t>(budget) - fixed;
  // Experts first: at 0% hits they cost ~n_layers * 6 experts per token, Engram rows 48 pages; a
  // modest hot-row cache catches the frequent n-grams (Zipf), the rest of the budget holds experts.
  // (Never out of the smallest expert cache: a budget near the minimum keeps one token's experts.)
  const int64_t spare = avail - n_active * p.expert_slot;
  p.engram_cache_bytes = std::min(p.engram_table_total, std::max(min_engram, std::min(spare, avail / 100)));
  avail -= p.engram_cache_bytes;
  p.expert_slots = std::min<int64_t>(p.n_experts, avail / p.expert_slot);
  p.expert_slab_bytes = p.expert_slots * p.expert_slot;
  if (p.expert_slots == p.n_experts) {
    // All experts fit: give the rest to Engram.
    p.engram_cache_bytes = std::min(p.engram_table_total, p.engram_cache_bytes + (avail - p.expert_slab_bytes));
  }
  p.engram_slots = p.engram_cache_bytes / std::max<int64_t>(1, engram_slot);
  if (p.engram_slots >= p.engram_rows_total) p.engram_slots = p.engram_rows_total;

  const int64_t L = c.n_layers;
  const double E = p.n_experts / std::max<double>(1, L);
  p.expert_hit = static_cast<double>(p.expert_slots) / std::max<int64_t>(1, p.n_experts);
  p.engram_hit = p.engram_rows_total ? static_cast<double>(p.engram_slots) / p.engram_rows_total : 1.0;
  const double expert_miss_bytes = (1 - p.expert_hit) * p.expert_bytes;
  const double engram_bytes = (1 - p.engram_hit) * p.engram_rows_per_token * kEngramMissDeviceBytes;
  p.ssd_bytes_per_decode_token = L * n_active * expert_miss_bytes + engram_bytes;
  // A chunk of C tokens reads each expert any of its tokens chose once: E * (1 - (1 - K/E)^C) per layer.
  const double C = std::max(1, options.prefill_chunk);
  const double distinct = E * (1 - std::pow(1 - n_active / E, C));
  p.ssd_bytes_per_prefill_token = L * distinct * expert_miss_bytes / C + engram_bytes;
  return p;
}

std::string residency_plan_text(const ResidencyPlan& p) {
  std::ostringstream o;
  char buf[256];
  o << "residency plan for --memory-budget " << gib(static_cast<double>(p.budget)) << ": "
    << (p.streaming ? "experts and Engram rows stream from the SSD" : "everything resident (mapped)") << "\n";
  auto row = [&](const char* what, double bytes, const std::string& note) {
    std::snprintf(buf, sizeof buf, "  %-22s %12s  %s\n", what, gib(bytes).c_str(), note.c_str());
    o << buf;
  };
  row("dense weights", p.dense_bytes, "resident (attention, shared experts, routers, embeddings, head)");
  if (p.coded_head_bytes) row("head, re-coded", p.coded_head_bytes, "12 bits per weight for the fast GEMV");
  if (p.kv_reserve_bytes) row("KV reserve", p.kv_reserve_bytes, "");
  if (p.streaming) row("workspace", p.workspace_reserve, "activations, scratch");
  std::snprintf(buf, sizeof buf, "%lld of %lld experts (%.1f%%), %s each", static_cast<long long>(p.expert_slots),
                static_cast<long long>(p.n_experts), 100.0 * p.expert_slots / std::max<int64_t>(1, p.n_experts),
                gib(p.expert_bytes).c_str());
  row("routed expert slab", p.expert_slab_bytes, buf);
  std::snprintf(buf, sizeof buf, "%lld of %lld rows (%.2f%%)", static_cast<long long>(p.engram_slots),
                static_cast<long long>(p.engram_rows_total),
                100.0 * p.engram_slots / std::max<int64_t>(1, p.engram_rows_total));
  row("Engram hot rows", p.engram_cache_bytes, buf);
  row("resident total", p.resident_total(), "");
  if (p.streaming) {
    std::snprintf(buf, sizeof buf,
                  "  expected SSD reads (uniform routing and hashing; skewed routing does better):\n"
                  "    per decoded token  %s  (expert hit %.1f%%, Engram hit %.2f%%)\n"
                  "    per prefill token  %s  (%d-token chunks, each expert read once per chunk)\n",
                  gib(p.ssd_bytes_per_decode_token).c_str(), 100 * p.expert_hit, 100 * p.engram_hit,
                  gib(p.ssd_bytes_per_prefill_token).c_str(), p.prefill_chunk);
    o << buf;
  }
  return o.str();
}

nlohmann::json residency_plan_json(const ResidencyPlan& p) {
  return {{"budget", p.budget},
          {"streaming", p.streaming},
          {"resident_bytes",
           {{"dense", p.dense_bytes},
            {"kv_reserve", p.kv_reserve_bytes},
            {"workspace", p.workspace_reserve},
            {"coded_head", p.coded_head_bytes},
            {"expert_slab", p.expert_slab_bytes},
            {"engram_cache", p.engram_cache_bytes},
            {"total", p.resident_total()}}},
          {"experts", {{"total", p.n_experts}, {"resident", p.expert_slots}, {"bytes_each", p.expert_bytes}}},
          {"engram_rows", {{"total", p.engram_rows_total}, {"resident", p.engram_slots}, {"per_token", p.engram_rows_per_token}}},
          {"expected_expert_hit", p.expert_hit},
          {"expected_engram_hit", p.engram_hit},
          {"ssd_bytes_per_decode_token", p.ssd_bytes_per_decode_token},
          {"ssd_bytes_per_prefill_token", p.ssd_bytes_per_prefill_token},
          {"prefill_chunk", p.prefill_chunk}};
}

Result<uint64_t> parse_size(const std::string& v, const std::string& flag) {
  size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = v.substr(used);
  if (unit.size() == 2 && (unit[1] == 'B' || unit[1] == 'b')) unit.pop_back();  // "64GB" reads as 64G
  const uint64_t mult = unit.empty() ? 1 : unit == "K" || unit == "k" ? 1ull << 10 : unit == "M" || unit == "m" ? 1ull << 20
                        : unit == "G" || unit == "g" ? 1ull << 30 : unit == "T" || unit == "t" ? 1ull << 40 : 0;
  if (used == 0 || mult == 0 || n == 0 || n > (UINT64_MAX / mult))
    return invalid_argument(flag + " must be a positive size such as 64G, 512M or 1048576, got '" + v + "'");
  return static_cast<uint64_t>(n) * mult;
}

uint64_t default_memory_budget(uint64_t reserve) {
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  while (f >> key) {
    if (key == "MemAvailable:") {
      f >> kib;
      break;
    }
    std::string rest;
    std::getline(f, rest);
  }
  const uint64_t avail = kib * 1024;
  return avail > reserve ? avail - reserve : 0;
}

}  // namespace cedar::model
