// cedar kv-report: the KV-cache economy of a model, measured from real cache allocations (kv::KvCache
// with a pool for the whole context and one sequence; lazily mapped, so 1M tokens is cheap), next to
// DeepSeek-V4-Flash and a dense GQA bf16 baseline (DeepSeek LLM 67B), with the ratios between them.
#include <xxhash.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "args.h"
#include "command.h"
#include "model/kv_layout.h"
#include "kv/geometry.h"
#include "kv/report.h"
#include "spec/config.h"
#include "spec/layer_plan.h"

namespace cedar::cli {
namespace {

constexpr const char* kUsage =
    "usage: cedar kv-report (--config FILE | -m DIR) [--context N] [--json]\n"
    "                       [--v4-config FILE] [--block-tokens N]\n"
    "  --config FILE        the model's config.json\n"
    "  -m, --model DIR      a model directory (its config.json is read; no weights needed)\n"
    "  --context N          tokens of the one sequence measured (default 1048576, at most 16777216)\n"
    "  --json               machine-readable output\n"
    "  --v4-config FILE     DeepSeek-V4-Flash config for the baseline (default: deepseek-v4-flash.json\n"
    "                       next to --config, else configs/ of the source tree)\n"
    "  --block-tokens N     tokens per cache block (default 256; a multiple of every compress ratio)\n";

// DeepSeek LLM 67B (spec §5.5): 95 layers, GQA with 8 KV heads of 128, bf16 K and V.
kv::ModelKvSpec dense_67b_spec() {
  kv::ModelKvSpec s;
  s.name = "deepseek-llm-67b";
  s.family = kv::KvFamily::kDenseGqa;
  s.head_dim = 128;
  s.n_kv_heads = 8;
  s.window_size = 0;
  for (int l = 0; l < 95; ++l) {
    kv::LayerKvSpec e;
    e.layer = l;
    e.compress_ratio = 1;
    e.owns_compressed_kv = true;
    e.kv_from = l;
    e.has_window = false;
    s.layers.push_back(e);
  }
  return s;
}

Result<kv::KvFootprint> measure_config(const std::string& path, int64_t context, uint32_t block_tokens,
                                       bool persists_swa) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + path);
  std::stringstream text;
  text << in.rdbuf();
  CEDAR_ASSIGN_OR_RETURN(model::ModelConfig c, model::load_config(path));
  const model::LayerPlan plan = model::make_layer_plan(c);
  std::string name = std::filesystem::path(path).stem().string();
  if (name == "config") name = std::filesystem::path(path).parent_path().filename().string();
  const std::string bytes = text.str();
  const kv::ModelKvSpec spec = model::kv_spec_from_plan(name, c, plan, XXH3_64bits(bytes.data(), bytes.size()));
  auto g = kv::make_cache_geometry(spec, block_tokens, c.n_layers);
  if (!g.ok()) return Status(g.status().code(), path + ": " + g.status().message());
  return kv::measure_footprint(*g, context, persists_swa);
}

std::string with_commas(uint64_t v) {
  const std::string digits = std::to_string(v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

void print_model(const kv::KvFootprint& f, bool main_model) {
  std::printf("%s (%s): %s tokens, %s blocks of %u tokens, %d KV-owner layers\n", f.model.c_str(),
              kv::kv_family_name(f.family), with_commas(static_cast<uint64_t>(f.context_tokens)).c_str(),
              with_commas(f.blocks_allocated).c_str(), f.block_tokens, f.kv_owner_layers);
  std::printf("  global KV       %10.2f B/token  (main KV %.2f + index keys %.2f)  = %s B, %.3f GiB\n",
              f.global_bytes_per_token, f.main_kv_bytes_per_token, f.index_key_bytes_per_token,
              with_commas(f.global_bytes).c_str(), f.global_bytes / (1024.0 * 1024.0 * 1024.0));
  if (f.window_layers > 0) {
    std::printf("  SWA rings       %s B per sequence (%d layers; backbone %d layers: %s B)\n",
                with_commas(f.swa_bytes_per_sequence).c_str(), f.window_layers, f.backbone_window_layers,
                with_commas(f.swa_backbone_bytes_per_sequence).c_str());
  }
  if (main_model) {
    std::printf("  per sequence    compressor tails %s B, Engram history %s B\n",
                with_commas(f.compressor_tail_bytes_per_sequence).c_str(),
                with_commas(f.engram_history_bytes_per_sequence).c_str());
    std::printf("  disk block file %s B per %u tokens (header + token ids + %s B boundary state + KV)\n",
                with_commas(f.block_file_bytes).c_str(), f.block_tokens,
                with_commas(f.boundary_state_bytes_per_block).c_str());
  }
  std::printf("  persisted       %10.2f B/token without SWA, %.2f B/token with SWA; this model's scheme: %s\n",
              f.persisted_bytes_per_token_without_swa, f.persisted_bytes_per_token_with_swa,
              f.persists_swa ? "with SWA" : "without SWA");
}

int cmd_kv_report(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--model", "--config", "--context", "--v4-config", "--block-tokens"},
                          {"--json", "--help"}, {{"-m", "--model"}});
  if (!args.ok()) {
    std::fprintf(stderr, "cedar kv-report: %s\n%s", args.status().message().c_str(), kUsage);
    return 2;
  }
  if (args->has("--help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (args->has("--model") == args->has("--config")) {
    std::fprintf(stderr, "cedar kv-report: give exactly one of -m DIR or --config FILE\n%s", kUsage);
    return 2;
  }
  auto context = args->get_int("--context", 1048576);
  auto block_tokens = args->get_int("--block-tokens", kv::kDefaultBlockTokens);
  if (!context.ok() || !block_tokens.ok()) {
    std::fprintf(stderr, "cedar kv-report: %s\n",
                 (!context.ok() ? context.status() : block_tokens.status()).message().c_str());
    return 2;
  }
  // The measured sequence really holds its token ids (4 B each), so the context is capped at 16M.
  if (*context <= 0 || *context > (int64_t{1} << 24) || *block_tokens <= 0 || *block_tokens > (1 << 20)) {
    std::fprintf(stderr, "cedar kv-report: --context must be in [1, 16777216] and --block-tokens in [1, 1048576]\n");
    return 2;
  }
  const std::string config_path =
      args->has("--model") ? *args->get("--model") + "/config.json" : *args->get("--config");
  std::string v4_path;
  if (auto v = args->get("--v4-config")) {
    v4_path = *v;
  } else {
    const auto sibling = std::filesystem::path(config_path).parent_path() / "deepseek-v4-flash.json";
    v4_path = std::filesystem::exists(sibling) ? sibling.string()
                                               : std::string(CEDAR_SOURCE_DIR) + "/configs/deepseek-v4-flash.json";
  }
  const uint32_t bt = static_cast<uint32_t>(*block_tokens);

  // The model's own scheme persists no SWA (rebuilt by bounded replay); V4-Flash saves it (spec §5.4).
  auto main = measure_config(config_path, *context, bt, /*persists_swa=*/false);
  if (!main.ok()) {
    std::fprintf(stderr, "cedar kv-report: %s\n", main.status().message().c_str());
    return 1;
  }
  auto v4 = measure_config(v4_path, *context, bt, /*persists_swa=*/true);
  if (!v4.ok()) {
    std::fprintf(stderr, "cedar kv-report: V4-Flash baseline: %s (pass --v4-config FILE)\n",
                 v4.status().message().c_str());
    return 1;
  }
  auto dense_geometry = kv::make_cache_geometry(dense_67b_spec(), bt);
  if (!dense_geometry.ok()) {
    std::fprintf(stderr, "cedar kv-report: %s\n", dense_geometry.status().message().c_str());
    return 1;
  }
  auto dense = kv::measure_footprint(*dense_geometry, *context, /*persists_swa=*/false);
  if (!dense.ok()) {
    std::fprintf(stderr, "cedar kv-report: dense baseline: %s\n", dense.status().message().c_str());
    return 1;
  }

  const kv::KvFootprint& m = *main;
  const kv::KvFootprint& b4 = *v4;
  const kv::KvFootprint& bd = *dense;
  // The "1/8" of spec §5.4 depends on how much of V4's persistent cache is SWA; it is exactly 1/2 at the
  // prefix length where one sequence's SWA equals its global KV.
  const double swa_half_tokens = static_cast<double>(b4.swa_bytes_per_sequence) / b4.persisted_bytes_per_token_without_swa;
  nlohmann::json ratios = {
      {"main_over_v4_flash_global", m.global_bytes_per_token / b4.global_bytes_per_token},
      {"v4_flash_over_main_global", b4.global_bytes_per_token / m.global_bytes_per_token},
      {"dense_67b_over_main_global", bd.global_bytes_per_token / m.global_bytes_per_token},
      {"main_over_v4_flash_persisted_at_context", m.persisted_bytes_per_token / b4.persisted_bytes_per_token},
      {"v4_flash_swa_equals_global_at_tokens", swa_half_tokens},
      {"main_over_v4_flash_persisted_when_swa_is_half",
       m.persisted_bytes_per_token_without_swa / (2.0 * b4.persisted_bytes_per_token_without_swa)},
  };
  if (args->has("--json")) {
    nlohmann::json j = kv::footprint_to_json(m);
    j["baselines"] = {{b4.model, kv::footprint_to_json(b4)}, {bd.model, kv::footprint_to_json(bd)}};
    j["ratios"] = ratios;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("KV cache measured from allocations (one sequence)\n\n");
  print_model(m, true);
  std::printf("\nbaselines\n");
  print_model(b4, false);
  print_model(bd, false);
  std::printf("\nratios\n");
  std::printf("  global KV  %s / %s = %.4f (1/%.2f)\n", m.model.c_str(), b4.model.c_str(),
              ratios["main_over_v4_flash_global"].get<double>(), ratios["v4_flash_over_main_global"].get<double>());
  std::printf("  global KV  %s / %s = %.1fx\n", bd.model.c_str(), m.model.c_str(),
              ratios["dense_67b_over_main_global"].get<double>());
  std::printf("  persisted  %s (no SWA) / %s (with SWA) = %.4f at %s tokens\n", m.model.c_str(), b4.model.c_str(),
              ratios["main_over_v4_flash_persisted_at_context"].get<double>(),
              with_commas(static_cast<uint64_t>(m.context_tokens)).c_str());
  std::printf("  persisted  the same ratio is %.4f (1/%.2f) for a %.0f-token prefix, where %s's SWA equals its "
              "global KV (SWA = half of its persisted cache)\n",
              ratios["main_over_v4_flash_persisted_when_swa_is_half"].get<double>(),
              1.0 / ratios["main_over_v4_flash_persisted_when_swa_is_half"].get<double>(), swa_half_tokens,
              b4.model.c_str());
  return 0;
}

}  // namespace
}  // namespace cedar::cli

CEDAR_COMMAND("kv-report", "KV-cache bytes per token, SWA and disk footprint vs V4-Flash and a dense 67B",
              cedar::cli::cmd_kv_report);
