// cedar eval: cross-entropy, perplexity and top-1 accuracy of a checkpoint on text files (like
// llama-perplexity), the unigram / bigram baselines of the same files, and with --compare the KV
// economy's alternatives against the reference setting (docs/EVAL.md).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "args.h"
#include "expert_parallel.h"
#include "residency_flags.h"
#include "command.h"
#include "cedar/platform.h"
#include "cedar/model.h"
#include "progress.h"
#include "cedar/eval.h"
#include "cedar/tokenizer.h"

namespace cedar::cli {
namespace {

using nlohmann::json;

constexpr const char* kUsage =
    "usage: cedar eval -m DIR --files F1 [F2 ...] [options]\n"
    "  -m, --model DIR          checkpoint directory\n"
    "  --files F...             held-out text files to score (each tokenized like generate's prompt: BOS first)\n"
    "  --baseline-files F...    training text for the unigram / bigram baselines scored on the same files\n"
    "  --ctx N                  tokens per window, BOS included (default 512)\n"
    "  --stride S               new tokens scored per window after the first (default ctx - 1: windows do\n"
    "                           not overlap; smaller: each window keeps ctx - 1 - S tokens of context)\n"
    "  --max-tokens N           score at most the first N tokens of each file (default: all)\n"
    "  --numerics MODE          fast (default) or exact\n"
    "  --threads K              worker threads (default: all cores)\n"
    "  --json                   print one JSON object instead of the text report\n"
    "  --expert-parallel        under mpirun: every rank computes a share of the routed experts, rank 0\n"
    "                           scores (docs/DISTRIBUTED.md); --exchange-timeout S as for generate\n"
    "  --memory-budget SIZE     RAM for weights, e.g. 64G (default: what the machine can spare); what does\n"
    "                           not fit streams from the SSD (docs/STREAMING.md)\n"
    "  --residency-stats PATH   routing statistics for warm restarts (default DIR/.cedar-expert-stats, or\n"
    "                           ~/.cache/cedar/ when DIR is read-only; 'none' keeps none)\n"
    "KV economy switches (docs/EVAL.md; every one off by default):\n"
    "  --kv-dtype ref|bf16      window and compressed KV as the reference stores them (FP8 / FP4, default)\n"
    "                           or in bf16 (experiment)\n"
    "  --resume-at P            run each window as a P-token prompt (one prefill) and a continuation (the\n"
    "                           decode path); only the continuation's tokens are scored\n"
    "  --replay bounded         with --resume-at: the continuation resumes from the prefix cache by\n"
    "                           bounded replay instead of continuing the prompt's own state\n"
    "  --decoder-narrowing      with --resume-at: prefill the layers after the last KV source on the last\n"
    "                           window_size prompt tokens only\n"
    "  --compare                run the reference (exact numerics, reference KV, full recompute) and each\n"
    "                           switch alone; print the markdown table of delta cross-entropy, greedy\n"
    "                           agreement and the bytes or work saved (--resume-at default: ctx / 2)\n";

int fail(const Status& st) {
  std::fprintf(stderr, "cedar eval: %s\n", st.message().c_str());
  return 1;
}

struct Doc {
  std::string path;
  std::vector<int32_t> ids;
};

Result<Doc> load_doc(const tokenizer::Tokenizer& tok, const std::string& path, long long max_tokens, size_t vocab) {
  if (!std::filesystem::is_regular_file(path))
    return invalid_argument("cannot read '" + path + "': no such file (check the path given to --files / --baseline-files)");
  CEDAR_ASSIGN_OR_RETURN(std::string text, read_whole_file(path));
  if (text.empty()) return invalid_argument("'" + path + "' is empty: nothing to score (remove it from the list)");
  auto ids = tok.encode(text, /*add_special=*/true);
  if (!ids.ok()) return invalid_argument("'" + path + "': " + ids.status().message());
  Doc d{path, std::move(*ids)};
  if (max_tokens > 0 && d.ids.size() > static_cast<size_t>(max_tokens)) d.ids.resize(static_cast<size_t>(max_tokens));
  if (d.ids.size() < 2)
    return invalid_argument("'" + path + "' has " + std::to_string(d.ids.size()) +
                            " token(s): at least two are needed to score one (add text or drop the file)");
  for (int32_t id : d.ids)
    if (id < 0 || static_cast<size_t>(id) >= vocab)
      return invalid_argument("'" + path + "' tokenizes to id " + std::to_string(id) + " outside the model's vocabulary");
  return d;
}

json summary_json(const runtime::ScoreSummary& s) {
  return {{"tokens", s.tokens}, {"cross_entropy", s.cross_entropy()}, {"perplexity", s.perplexity()},
          {"top1", s.top1()}};
}

// The baselines on one document's targets (every token after the first).
void score_baselines(const runtime::NgramBaseline& b, const std::vector<int32_t>& d, runtime::ScoreSummary& uni,
                     runtime::ScoreSummary& bi) {
  for (size_t j = 1; j < d.size(); ++j) {
    uni.tokens++;
    uni.nll_sum -= b.unigram_logprob(d[j]);
    uni.correct += b.unigram_argmax() == d[j];
    bi.tokens++;
    bi.nll_sum -= b.bigram_logprob(d[j - 1], d[j]);
    bi.correct += b.bigram_argmax(d[j - 1]) == d[j];
  }
}

struct RunResult {
  std::vector<runtime::TokenScores> scores;  // per document
  runtime::EvalWork work;
};

Result<RunResult> run_all(model::Model& m, const std::vector<Doc>& docs, bool has_bos, const runtime::EvalOptions& o,
                          const std::string& label) {
  uint64_t total_windows = 0;
  for (const Doc& d : docs) {
    CEDAR_ASSIGN_OR_RETURN(auto w, runtime::make_windows(d.ids.size(), has_bos, o.ctx, o.stride));
    total_windows += w.size();
  }
  ProgressBar bar(label);
  uint64_t windows = 0, scored = 0;
  RunResult r;
  for (const Doc& d : docs) {
    auto s = runtime::score_document(m, d.ids, has_bos, o, &ThreadPool::global(), &r.work, [&](size_t n) {
      scored += n;
      bar.update(++windows, total_windows, std::to_string(scored) + " tokens");
    });
    if (!s.ok()) return Status(s.status().code(), d.path + ": " + s.status().message());
    r.scores.push_back(std::move(*s));
  }
  bar.finish();
  return r;
}

// KV bytes: the global KV per token (main + index keys of every owner) and the windows of all layers.
struct KvBytes {
  double global_per_token = 0;
  uint64_t windows = 0;
};
KvBytes kv_bytes(model::Model& m, model::KvDtype dtype) {
  const model::KvDtype was = m.options().kv_dtype;
  m.set_kv_dtype(dtype);
  auto g = m.kv_geometry();
  m.set_kv_dtype(was);
  CEDAR_CHECK(g.ok(), "%s", g.status().to_string().c_str());
  KvBytes b;
  b.global_per_token = static_cast<double>(g->block_bytes) / g->block_tokens;
  b.windows = uint64_t{g->window_slots} * g->window_entry_bytes * static_cast<uint64_t>(m.config().n_layers);
  return b;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

int run_compare(model::Model& m, const std::vector<Doc>& docs, bool has_bos, runtime::EvalOptions base, bool as_json,
                json& out) {
  if (base.resume_at == 0) base.resume_at = base.ctx / 2;
  const model::ModelOptions saved = m.options();
  m.set_numerics(ops::Numerics::kExact);
  m.set_kv_dtype(model::KvDtype::kReference);
  m.set_decoder_narrowing(false);
  runtime::EvalOptions cold = base, split = base, bounded = base;
  cold.path = runtime::EvalPath::kCold;
  split.path = runtime::EvalPath::kSplit;
  bounded.path = runtime::EvalPath::kBounded;

  auto ref_cold = run_all(m, docs, has_bos, cold, "reference (one prefill per window)");
  if (!ref_cold.ok()) return fail(ref_cold.status());
  auto ref_split = run_all(m, docs, has_bos, split, "reference (prompt + continuation)");
  if (!ref_split.ok()) return fail(ref_split.status());

  struct Row {
    std::string name, compared_with, cost;
    json cost_json;
    runtime::ScoreSummary ref, var;
    runtime::ScoreComparison cmp;
  };
  std::vector<Row> rows;
  auto add_row = [&](Row row, const RunResult& ref, const RunResult& var) -> Status {
    for (size_t i = 0; i < docs.size(); ++i) {
      row.ref.add(ref.scores[i], docs[i].ids);
      row.var.add(var.scores[i], docs[i].ids);
      CEDAR_RETURN_IF_ERROR(row.cmp.add(ref.scores[i], var.scores[i]));
    }
    rows.push_back(std::move(row));
    return {};
  };

  // (a) bf16 KV.
  m.set_kv_dtype(model::KvDtype::kBf16);
  auto bf16 = run_all(m, docs, has_bos, cold, "bf16 KV");
  m.set_kv_dtype(model::KvDtype::kReference);
  if (!bf16.ok()) return fail(bf16.status());
  {
    const KvBytes r = kv_bytes(m, model::KvDtype::kReference), b = kv_bytes(m, model::KvDtype::kBf16);
    Row row{"bf16 KV (window + compressed)", "reference FP8/FP4 KV", "", {}, {}, {}, {}};
    row.cost = "global KV " + fmt("%.1f", r.global_per_token) + " vs " + fmt("%.1f", b.global_per_token) +
               " B/token (FP4/FP8 saves " + fmt("%.2f", b.global_per_token / r.global_per_token) + "x); windows " +
               std::to_string(r.windows) + " vs " + std::to_string(b.windows) + " B/sequence";
    row.cost_json = {{"global_kv_bytes_per_token_reference", r.global_per_token},
                     {"global_kv_bytes_per_token_bf16", b.global_per_token},
                     {"window_bytes_per_sequence_reference", r.windows},
                     {"window_bytes_per_sequence_bf16", b.windows}};
    if (Status st = add_row(std::move(row), *ref_cold, *bf16); !st.ok()) return fail(st);
  }
  // (b) bounded replay at the resume point.
  auto replay = run_all(m, docs, has_bos, bounded, "bounded replay");
  if (!replay.ok()) return fail(replay.status());
  {
    const auto& w = replay->work;
    Row row{"bounded replay at the resume point", "full recompute of the prompt", "", {}, {}, {}, {}};
    row.cost = "prompt tokens run again on resume: " + std::to_string(w.prefix_tokens) + " (full) vs " +
               std::to_string(w.replayed_tokens) + " (bounded)";
    row.cost_json = {{"prompt_tokens_full", w.prefix_tokens}, {"prompt_tokens_replayed", w.replayed_tokens}};
    if (Status st = add_row(std::move(row), *ref_split, *replay); !st.ok()) return fail(st);
  }
  // (c) decoder narrowing of the prompt's prefill.
  m.set_decoder_narrowing(true);
  auto narrow = run_all(m, docs, has_bos, split, "decoder narrowing");
  m.set_decoder_narrowing(false);
  if (!narrow.ok()) return fail(narrow.status());
  {
    const auto& plan = m.plan();
    const int last_kv = plan.kv_owner_layers.empty() ? -1 : plan.kv_owner_layers.back();
    const uint64_t L = static_cast<uint64_t>(m.config().n_layers), after = L - static_cast<uint64_t>(last_kv + 1);
    const uint64_t win = static_cast<uint64_t>(m.config().window_size);
    // Per window: the prompt's P tokens run through every layer, or the last `win` of them through the
    // layers after the last KV source.
    uint64_t full = 0, narrowed = 0;
    for (const auto& d : docs) {
      auto ws = runtime::make_windows(d.ids.size(), has_bos, base.ctx, base.stride);
      for (const auto& w : *ws) {
        const size_t len = w.size();
        if (len < 3) continue;
        const uint64_t p = std::clamp<uint64_t>(static_cast<uint64_t>(base.resume_at), 1, len - 2);
        full += p * L;
        narrowed += p * (L - after) + std::min(p, win) * after;
      }
    }
    Row row{"decoder narrowing of the prompt", "full prefill of the prompt", "", {}, {}, {}, {}};
    row.cost = "layer x token evaluations of the prompts: " + std::to_string(full) + " vs " + std::to_string(narrowed) +
               " (" + fmt("%.1f", full ? 100.0 * static_cast<double>(full - narrowed) / static_cast<double>(full) : 0) +
               "% saved)";
    row.cost_json = {{"layer_tokens_full", full}, {"layer_tokens_narrowed", narrowed}};
    if (Status st = add_row(std::move(row), *ref_split, *narrow); !st.ok()) return fail(st);
  }
  // (d) fast numerics.
  m.set_numerics(ops::Numerics::kFast);
  auto fast = run_all(m, docs, has_bos, cold, "fast numerics");
  m.set_numerics(saved.numerics);
  if (!fast.ok()) return fail(fast.status());
  {
    const double te = ref_cold->work.seconds, tf = fast->work.seconds;
    Row row{"fast numerics", "exact numerics", "", {}, {}, {}, {}};
    row.cost = "eval time " + fmt("%.2f", te) + " s vs " + fmt("%.2f", tf) + " s (" + fmt("%.2f", te / std::max(tf, 1e-9)) +
               "x)";
    row.cost_json = {{"seconds_exact", te}, {"seconds_fast", tf}};
    if (Status st = add_row(std::move(row), *ref_cold, *fast); !st.ok()) return fail(st);
  }
  m.set_kv_dtype(saved.kv_dtype);
  m.set_decoder_narrowing(saved.decoder_narrowing);

  json variants = json::array();
  for (const Row& r : rows)
    variants.push_back({{"setting", r.name}, {"reference", r.compared_with}, {"tokens", r.cmp.tokens},
                        {"reference_cross_entropy", r.ref.cross_entropy()},
                        {"variant_cross_entropy", r.var.cross_entropy()},
                        {"delta_cross_entropy", r.cmp.delta_cross_entropy()},
                        {"greedy_agreement", r.cmp.agreement()}, {"cost", r.cost_json}});
  out["compare"] = {{"resume_at", base.resume_at}, {"variants", variants}};
  if (!as_json) {
    std::printf("\nKV economy (%zu file(s), ctx %d, resume at %d; the reference: exact numerics, FP8/FP4 KV, full "
                "recompute, full prefill)\n\n",
                docs.size(), base.ctx, base.resume_at);
    std::printf("| setting | compared with | tokens | CE ref | CE variant | delta CE (nats/token) | greedy agreement | "
                "bytes or work |\n|---|---|---:|---:|---:|---:|---:|---|\n");
    for (const Row& r : rows)
      std::printf("| %s | %s | %llu | %.4f | %.4f | %+.5f | %.2f%% | %s |\n", r.name.c_str(), r.compared_with.c_str(),
                  static_cast<unsigned long long>(r.cmp.tokens), r.ref.cross_entropy(), r.var.cross_entropy(),
                  r.cmp.delta_cross_entropy(), 100.0 * r.cmp.agreement(), r.cost.c_str());
  }
  return 0;
}

int cmd_eval(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv,
                          {"--model", "--ctx", "--stride", "--max-tokens", "--numerics", "--threads", "--kv-dtype",
                           "--resume-at", "--replay", "--memory-budget", "--residency-stats", kExpertParallelFlags[0]},
                          {"--json", "--decoder-narrowing", "--compare", "--expert-parallel", "--help"},
                          {{"-m", "--model"}},
                          {"--files", "--baseline-files"});
  if (!args.ok()) {
    std::fprintf(stderr, "cedar eval: %s\n%s", args.status().message().c_str(), kUsage);
    return 2;
  }
  if (args->has("--help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  auto usage_error = [](const std::string& msg) {
    std::fprintf(stderr, "cedar eval: %s\n", msg.c_str());
    return 2;
  };
  if (!args->has("--model") || !args->has("--files")) return usage_error(std::string("need -m DIR and --files F...\n") + kUsage);
  if (!args->positional().empty()) return usage_error("unexpected argument '" + args->positional()[0] + "'");
  auto ctx = args->get_int("--ctx", 512);
  auto stride = args->get_int("--stride", 0);
  auto max_tokens = args->get_int("--max-tokens", 0);
  auto threads = args->get_int("--threads", 0);
  auto resume_at = args->get_int("--resume-at", 0);
  for (const Status* st : {&ctx.status(), &stride.status(), &max_tokens.status(), &threads.status(), &resume_at.status()})
    if (!st->ok()) return usage_error(st->message());
  if (*ctx < 2) return usage_error("--ctx must be at least 2 (a window holds a token and the one it predicts)");
  if (*stride < 0 || *stride > *ctx - 1)
    return usage_error("--stride must be between 1 and ctx - 1 = " + std::to_string(*ctx - 1) + " (0: ctx - 1)");
  if (*max_tokens < 0 || *threads < 0) return usage_error("--max-tokens and --threads must be >= 0");
  if (*resume_at < 0 || (*resume_at > 0 && *resume_at > *ctx - 2))
    return usage_error("--resume-at must be between 1 and ctx - 2 = " + std::to_string(*ctx - 2) +
                       " (the prompt and at least one continuation token fit in a window)");
  const auto numerics = ops::parse_numerics(args->get_or("--numerics", "fast"));
  if (!numerics) return usage_error("--numerics must be 'fast' or 'exact'");
  const std::string kv_dtype = args->get_or("--kv-dtype", "ref");
  if (kv_dtype != "ref" && kv_dtype != "bf16") return usage_error("--kv-dtype must be 'ref' or 'bf16'");
  const std::string replay = args->get_or("--replay", "full");
  if (replay != "full" && replay != "bounded") return usage_error("--replay must be 'full' or 'bounded'");
  const bool compare = args->has("--compare");
  if ((replay == "bounded" || args->has("--decoder-narrowing")) && !*resume_at && !compare)
    return usage_error("--replay bounded and --decoder-narrowing act at a resume point: give --resume-at P");
  if (replay == "bounded" && kv_dtype == "bf16")
    return usage_error("--replay bounded needs the prefix cache, which stores the reference KV only (drop --kv-dtype bf16)");
  if (compare && (kv_dtype != "ref" || replay != "full" || args->has("--decoder-narrowing")))
    return usage_error("--compare runs every switch itself; give no --kv-dtype / --replay / --decoder-narrowing");

  const std::string dir = *args->get("--model");
  model::ModelOptions mopts;
  mopts.numerics = *numerics;
  mopts.kv_dtype = kv_dtype == "bf16" ? model::KvDtype::kBf16 : model::KvDtype::kReference;
  mopts.decoder_narrowing = args->has("--decoder-narrowing");
  if (Status st = residency_from_flags(*args, dir, &mopts.residency); !st.ok()) return usage_error(st.message());
  // --compare switches the numerics mode on the head alone, which the ranks agreed on at start.
  if (compare && args->has("--expert-parallel")) return usage_error("--compare cannot run with --expert-parallel");
  // Expert parallelism: a worker rank serves the head inside this call and exits.
  auto expert_parallel = start_expert_parallel(*args, dir, &mopts, args->has("--memory-budget"));
  if (!expert_parallel.ok()) return fail(expert_parallel.status());
  ProgressBar load_bar("mapping checkpoint");
  mopts.progress = [&](const io::CheckpointProgress& p) { load_bar.update(p.bytes_done, p.bytes_total); };
  auto model = model::Model::load(dir, mopts);
  load_bar.finish();
  if (!model.ok()) return fail(model.status());
  if (*expert_parallel) (*expert_parallel)->attach(**model);
  model::Model& m = **model;
  print_residency_line(m);
  // Routing statistics for a warm restart when streaming, on every way out (a failure is reported,
  // the evaluation's result stands).
  struct SaveStats {
    model::Model& m;
    ~SaveStats() {
      if (Status st = m.save_residency_stats(); !st.ok()) std::fprintf(stderr, "cedar eval: %s\n", st.message().c_str());
    }
  } save_stats{m};
  const int64_t max_pos = m.config().max_position_embeddings;
  if (max_pos > 0 && *ctx > max_pos)
    return usage_error("--ctx " + std::to_string(*ctx) + " exceeds the model's max_position_embeddings " +
                       std::to_string(max_pos) + ": lower --ctx");
  auto tok = tokenizer::Tokenizer::load_dir(dir);
  if (!tok.ok()) return fail(tok.status());
  const bool has_bos = (*tok)->adds_bos();
  if (*threads > 0) ThreadPool::set_default_threads(static_cast<int>(*threads));

  std::vector<Doc> docs, train;
  for (const std::string& f : args->get_list("--files")) {
    auto d = load_doc(**tok, f, *max_tokens, m.config().vocab_size);
    if (!d.ok()) return fail(d.status());
    docs.push_back(std::move(*d));
  }
  for (const std::string& f : args->get_list("--baseline-files")) {
    auto d = load_doc(**tok, f, 0, m.config().vocab_size);
    if (!d.ok()) return fail(d.status());
    train.push_back(std::move(*d));
  }
  runtime::EvalOptions o;
  o.ctx = static_cast<int>(*ctx);
  o.stride = static_cast<int>(*stride);
  o.resume_at = static_cast<int>(*resume_at);
  o.path = !*resume_at ? runtime::EvalPath::kCold
                       : (replay == "bounded" ? runtime::EvalPath::kBounded : runtime::EvalPath::kSplit);
  const bool as_json = args->has("--json");
  json out = {{"model", dir},
              {"ctx", o.ctx},
              {"stride", o.stride ? o.stride : o.ctx - 1},
              {"numerics", ops::numerics_name(*numerics)},
              {"kv_dtype", kv_dtype},
              {"resume_at", o.resume_at},
              {"replay", replay},
              {"decoder_narrowing", mopts.decoder_narrowing},
              {"vocab", m.sampleable_vocab()}};
  if (compare) {
    const int rc = run_compare(m, docs, has_bos, o, as_json, out);
    if (rc != 0) return rc;
    if (as_json) std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
  }
  auto run = run_all(m, docs, has_bos, o, "eval");
  if (!run.ok()) return fail(run.status());
  std::unique_ptr<runtime::NgramBaseline> baseline;
  if (!train.empty()) {
    std::vector<std::vector<int32_t>> ids;
    for (const Doc& d : train) ids.push_back(d.ids);
    baseline = std::make_unique<runtime::NgramBaseline>(ids, m.sampleable_vocab());
  }
  runtime::ScoreSummary total, uni_total, bi_total;
  json files = json::array();
  for (size_t i = 0; i < docs.size(); ++i) {
    runtime::ScoreSummary s;
    s.add(run->scores[i], docs[i].ids);
    total.add(run->scores[i], docs[i].ids);
    json f = summary_json(s);
    f["file"] = docs[i].path;
    if (baseline) {
      runtime::ScoreSummary uni, bi;
      score_baselines(*baseline, docs[i].ids, uni, bi);
      score_baselines(*baseline, docs[i].ids, uni_total, bi_total);
      f["unigram"] = summary_json(uni);
      f["bigram"] = summary_json(bi);
    }
    files.push_back(f);
  }
  out["files"] = files;
  out["total"] = summary_json(total);
  out["seconds"] = run->work.seconds;
  if (baseline) {
    json tf = json::array();
    for (const Doc& d : train) tf.push_back(d.path);
    out["baselines"] = {{"train_files", tf},
                        {"train_targets", baseline->targets()},
                        {"smoothing", "unigram add-one; bigram interpolated Kneser-Ney, D = 0.75, add-one continuation"},
                        {"unigram", summary_json(uni_total)},
                        {"bigram", summary_json(bi_total)}};
  }
  if (as_json) {
    std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("%-40s %10s %12s %12s %8s\n", "file", "tokens", "CE (nats)", "perplexity", "top-1");
  auto line = [](const std::string& name, const runtime::ScoreSummary& s) {
    std::printf("%-40s %10llu %12.4f %12.3f %7.2f%%\n", name.c_str(), static_cast<unsigned long long>(s.tokens),
                s.cross_entropy(), s.perplexity(), 100.0 * s.top1());
  };
  for (size_t i = 0; i < docs.size(); ++i) {
    runtime::ScoreSummary s;
    s.add(run->scores[i], docs[i].ids);
    line(docs[i].path, s);
  }
  line("total (cedar)", total);
  if (baseline) {
    line("total (unigram baseline)", uni_total);
    line("total (bigram baseline)", bi_total);
  } else {
    std::printf("(no --baseline-files: the unigram / bigram baselines were not computed)\n");
  }
  std::fflush(stdout);
  std::fprintf(stderr, "eval: %llu tokens in %llu windows, %.2f s (%.1f tokens/s), %d threads\n",
               static_cast<unsigned long long>(total.tokens), static_cast<unsigned long long>(run->work.windows),
               run->work.seconds, static_cast<double>(run->work.prefill_tokens + run->work.continuation_tokens) /
                                      std::max(run->work.seconds, 1e-9),
               ThreadPool::global().size());
  return 0;
}

}  // namespace

CEDAR_COMMAND("eval", "cross-entropy / perplexity / top-1 on text files, baselines, KV-economy table", cmd_eval);

}  // namespace cedar::cli
