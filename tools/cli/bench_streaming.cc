#include "bench_streaming.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cedar/platform.h"
#include "cedar/model.h"
#include "spec/weight_inventory.h"
#include "ops/kernel_set.h"
#include "ops/sample/sample.h"
#include "cedar/tokenizer.h"

namespace cedar::cli {
namespace {

struct Row {
  std::string budget_label;
  uint64_t budget = 0;
  bool streaming = false;
  std::string test;
  long long tokens = 0;
  double tok_s = 0;
  double ssd_bytes_per_token = 0;
  double expert_hit = 0, engram_hit = 0, lookahead_precision = 0;
  double read_gb_s = 0;       // SSD bytes / wall time of the test
  double io_wait_share = 0;   // time waiting for reads / wall time
};

// "100%,50%,25%" (of the bytes the forward pass reads: dense + experts + Engram tables) or sizes.
Result<std::vector<std::pair<std::string, uint64_t>>> parse_budgets(const std::string& text, double model_bytes) {
  std::vector<std::pair<std::string, uint64_t>> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty() && item.back() == '%') {
      char* end = nullptr;
      const double pct = std::strtod(item.c_str(), &end);
      if (end != item.c_str() + item.size() - 1 || !(pct > 0))
        return invalid_argument("--memory-budget: bad percentage '" + item + "'");
      out.push_back({item, static_cast<uint64_t>(model_bytes * pct / 100.0)});
    } else {
      CEDAR_ASSIGN_OR_RETURN(uint64_t b, model::parse_size(item, "--memory-budget"));
      out.push_back({item, b});
    }
  }
  if (out.empty()) return invalid_argument("--memory-budget: empty list");
  return out;
}

std::vector<int32_t> ids_for(size_t n, size_t offset, size_t vocab) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(((offset + i) * 7919 + 17) % vocab);
  return ids;
}

}  // namespace

int bench_streaming(const Args& args) {
  const std::string dir = *args.get("--model");
  auto cfg = model::load_config(dir + "/config.json");
  if (!cfg.ok()) {
    std::fprintf(stderr, "cedar bench: %s\n", cfg.status().message().c_str());
    return 1;
  }
  const model::LayerPlan lp = model::make_layer_plan(*cfg);
  const model::ParamCounts counts = model::count_params(model::weight_inventory(*cfg));
  const model::ResidencyPlan full = model::resident_plan(*cfg, lp, counts);
  // 100% means "everything the forward pass reads fits", workspace included, and the head re-coded
  // for fast numerics (the default; an exact run then has that much to spare).
  const double model_bytes =
      static_cast<double>(full.dense_bytes + full.coded_head_bytes + full.routed_expert_total + full.engram_table_total) *
      1.03;
  auto budgets = parse_budgets(*args.get("--memory-budget"), model_bytes);
  if (!budgets.ok()) {
    std::fprintf(stderr, "cedar bench: %s\n", budgets.status().message().c_str());
    return 2;
  }
  const long long p = std::stoll(args.get_or("--n-prompt", "512"));
  const long long n = std::stoll(args.get_or("--n-gen", "32"));
  const int threads = std::stoi(args.get_or("--threads", std::to_string(hardware_threads())));
  const int reps = std::stoi(args.get_or("--repetitions", "1"));
  const double fio = std::stod(args.get_or("--fio-bandwidth", "0"));  // bytes/s, from the bench script
  const auto numerics = ops::parse_numerics(args.get_or("--numerics", "fast"));
  if (!numerics || p < 0 || n < 0 || threads < 1 || reps < 1) {
    std::fprintf(stderr, "cedar bench: bad -p / -n / -t / -r / --numerics for a --memory-budget run\n");
    return 2;
  }
  // A real text repeats n-grams (Engram rows) and routes like text; synthetic ids do neither.
  std::vector<int32_t> text_ids;
  if (args.has("--prompt-file")) {
    auto text = read_whole_file(*args.get("--prompt-file"));
    auto tok = tokenizer::Tokenizer::load_dir(dir);
    if (!text.ok() || !tok.ok()) {
      std::fprintf(stderr, "cedar bench: --prompt-file: %s\n",
                   (!text.ok() ? text.status() : tok.status()).message().c_str());
      return 1;
    }
    auto ids = (*tok)->encode(*text, /*add_special=*/false);
    if (!ids.ok() || ids->empty()) {
      std::fprintf(stderr, "cedar bench: --prompt-file: cannot tokenize it\n");
      return 1;
    }
    text_ids = *ids;
  }
  ThreadPool pool(threads);
  std::vector<Row> rows;
  for (const auto& [label, budget] : *budgets) {
    model::ModelOptions o;
    o.numerics = *numerics;
    o.residency.memory_budget = budget;
    o.residency.stats_file = args.get_or("--residency-stats", "none") == "none" ? "" : *args.get("--residency-stats");
    o.residency.lookahead = !args.has("--no-lookahead");
    auto loaded = model::Model::load(dir, o);
    if (!loaded.ok()) {
      std::fprintf(stderr, "cedar bench: budget %s: %s\n", label.c_str(), loaded.status().message().c_str());
      return 1;
    }
    model::Model& m = **loaded;
    const size_t vocab = m.sampleable_vocab();
    std::vector<float> logits(m.config().vocab_size);
    std::fprintf(stderr, "budget %s (%.2f GiB): %s, %lld of %lld experts resident\n", label.c_str(), budget / 1073741824.0,
                 m.streaming() ? "streaming" : "resident", static_cast<long long>(m.residency_plan().expert_slots),
                 static_cast<long long>(m.residency_plan().n_experts));
    // pp then tg on one sequence per repetition: decode runs after the prompt, as in real use.
    for (int r = 0; r < reps; ++r) {
      model::SequenceState seq = m.new_sequence(p + n + 2);
      std::vector<int32_t> prompt = ids_for(static_cast<size_t>(std::max<long long>(p, 1)), static_cast<size_t>(r) * 1000, vocab);
      if (!text_ids.empty())
        for (size_t i = 0; i < prompt.size(); ++i)
          prompt[i] = std::min<int32_t>(text_ids[(i + static_cast<size_t>(r) * 997) % text_ids.size()],
                                        static_cast<int32_t>(vocab) - 1);
      auto measure = [&](const std::string& test, long long tokens, auto&& body) -> Status {
        m.reset_residency_stats();
        Timer t;
        CEDAR_RETURN_IF_ERROR(body());
        const double s = t.seconds();
        const model::ResidencyStats st = m.residency_stats();
        const model::LookaheadStats la = m.lookahead_stats();
        Row row;
        row.budget_label = label;
        row.budget = budget;
        row.streaming = m.streaming();
        row.test = test;
        row.tokens = tokens;
        row.tok_s = tokens / s;
        const double bytes = static_cast<double>(st.expert_bytes + st.engram_bytes);
        row.ssd_bytes_per_token = bytes / tokens;
        const double eh = st.expert_hits + st.expert_misses, gh = st.engram_hits + st.engram_misses;
        row.expert_hit = eh > 0 ? st.expert_hits / eh : 1.0;
        row.engram_hit = gh > 0 ? st.engram_hits / gh : 1.0;
        row.lookahead_precision = la.predicted ? static_cast<double>(la.correct) / la.predicted : 0.0;
        row.read_gb_s = bytes / s / 1e9;
        row.io_wait_share = st.io_wait_seconds / s;
        rows.push_back(row);
        std::fprintf(stderr, "  %s: %.2f tok/s, %.1f MB/token from SSD, experts hit %.1f%%, Engram hit %.1f%%\n",
                     test.c_str(), row.tok_s, row.ssd_bytes_per_token / 1e6, 100 * row.expert_hit, 100 * row.engram_hit);
        return {};
      };
      Status st;
      if (p > 0)
        st = measure("pp" + std::to_string(p), p, [&]() -> Status {
          model::SeqChunk ch{&seq, prompt};
          return m.forward({&ch, 1}, logits.data(), &pool);
        });
      else {
        model::SeqChunk ch{&seq, prompt};
        st = m.forward({&ch, 1}, logits.data(), &pool);
      }
      if (st.ok() && n > 0)
        st = measure("tg" + std::to_string(n), n, [&]() -> Status {
          int32_t next = ops::argmax(logits.data(), vocab);
          for (long long i = 0; i < n; ++i) {
            model::SeqChunk ch{&seq, {&next, 1}};
            CEDAR_RETURN_IF_ERROR(m.forward({&ch, 1}, logits.data(), &pool));
            next = ops::argmax(logits.data(), vocab);
          }
          return {};
        });
      if (!st.ok()) {
        std::fprintf(stderr, "cedar bench: %s\n", st.message().c_str());
        return 1;
      }
    }
    if (Status st = m.save_residency_stats(); !st.ok()) std::fprintf(stderr, "cedar bench: %s\n", st.message().c_str());
  }

  if (args.get_or("--output", "md") == "json") {
    nlohmann::json j = {{"model", dir}, {"fio_random_read_bytes_per_s", fio}, {"results", nlohmann::json::array()}};
    for (const Row& r : rows)
      j["results"].push_back({{"budget", r.budget_label}, {"budget_bytes", r.budget}, {"streaming", r.streaming},
                              {"lookahead", !args.has("--no-lookahead")}, {"test", r.test}, {"tokens", r.tokens}, {"tok_s", r.tok_s},
                              {"ssd_bytes_per_token", r.ssd_bytes_per_token}, {"expert_hit", r.expert_hit},
                              {"engram_hit", r.engram_hit}, {"lookahead_precision", r.lookahead_precision},
                              {"read_gb_s", r.read_gb_s}, {"io_wait_share", r.io_wait_share},
                              {"read_bw_vs_fio", fio > 0 ? r.read_gb_s * 1e9 / fio : 0.0},
                              {"tok_s_vs_ssd_bound",
                               fio > 0 && r.ssd_bytes_per_token > 0 ? r.tok_s / (fio / r.ssd_bytes_per_token) : 0.0}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("| budget | mode | test | tok/s | SSD MB/token | expert hit | Engram hit | look-ahead precision | "
              "read GB/s | I/O wait | read bw / fio | tok/s / SSD-bound tok/s |\n");
  std::printf("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    char a[32] = "", b[32] = "";
    if (fio > 0) {
      std::snprintf(a, sizeof a, "%.2f", r.read_gb_s * 1e9 / fio);
      if (r.ssd_bytes_per_token > 0) std::snprintf(b, sizeof b, "%.2f", r.tok_s / (fio / r.ssd_bytes_per_token));
    }
    std::printf("| %s | %s | %s | %.2f | %.1f | %.1f%% | %.1f%% | %.1f%% | %.2f | %.0f%% | %s | %s |\n",
                r.budget_label.c_str(), !r.streaming ? "resident" : args.has("--no-lookahead") ? "stream, no look-ahead" : "stream", r.test.c_str(), r.tok_s,
                r.ssd_bytes_per_token / 1e6, 100 * r.expert_hit, 100 * r.engram_hit, 100 * r.lookahead_precision,
                r.read_gb_s, 100 * r.io_wait_share, a, b);
  }
  return 0;
}

}  // namespace cedar::cli
