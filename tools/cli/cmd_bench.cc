// cedar bench: prefill (pp) and decode (tg) speed of a checkpoint in the manner of llama-bench, at
// several context depths, thread counts and both numerics modes, beside the machine's own limits:
// its measured memory read bandwidth (decode reads every active weight once per token, so the
// fraction of that bandwidth decode achieves is the figure of merit) and its measured fp32/bf16
// GEMM peak (prefill is compute bound: its matmul FLOP/s are reported as a fraction of the peak).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "args.h"
#include "bench_interleave.h"
#include "bench_streaming.h"
#include "command.h"
#include "expert_parallel.h"
#include "cedar/platform.h"
#include "cedar/model.h"
#include "model_summary.h"
#include "spec/weight_inventory.h"
#include "ops/linear/bf16_coded.h"
#include "ops/formats/formats.h"
#include "ops/kernel_set.h"
#include "ops/simd/prefetch.h"
#include "ops/sample/sample.h"
#include "runtime/sampler.h"
#include "cedar/engine.h"

namespace cedar::cli {
namespace {

constexpr const char* kUsage =
    "usage: cedar bench -m DIR [-p LIST] [-n LIST] [-d LIST] [-t LIST] [-r N] [--rounds N] [--numerics LIST]\n"
    "                   [-o md|json]\n"
    "  -m, --model DIR      checkpoint directory\n"
    "  -p, --n-prompt LIST  prompt lengths to prefill, e.g. 512 or 128,512 (default 512; 0 = none)\n"
    "  -n, --n-gen LIST     tokens to decode (default 128; 0 = none)\n"
    "  -d, --depth LIST     tokens already in the context before each test (default 0), e.g. 0,4096,32768\n"
    "  -t, --threads LIST   thread counts (default: all cores)\n"
    "  -r, --repetitions N  runs per test; mean and standard deviation are reported (default 3)\n"
    "  --rounds N           run the whole sweep N times, every thread count in turn in each round, and\n"
    "                       report each thread count's speed over the first one's round by round (on a\n"
    "                       machine whose bandwidth drifts, a ratio within one round is what compares)\n"
    "  --numerics LIST      fast and/or exact (default fast)\n"
    "  --no-warmup          no untimed run of each test before its repetitions (by default the first\n"
    "                       thread count of the first round has one, which faults in the weights)\n"
    "  -o, --output FMT     md (default, a Markdown table) or json\n"
    "  --speculative MODE   off (default), on or auto: beside each tgN, tgN+dspark decodes the same greedy\n"
    "                       tokens with the DSpark draft head and its guard (verify passes, one sequence)\n"
    "  --memory-budget LIST budgets such as 100%,50%,25% (of the weights the model reads) or 64G: for each,\n"
    "                       pp then tg on one sequence with SSD bytes/token, hit rates, look-ahead\n"
    "                       precision and read bandwidth (docs/STREAMING.md; -n defaults to 32, -r to 1)\n"
    "  --fio-bandwidth B/S  the device's random-read bandwidth (bench/stream_bench.sh measures it with fio)\n"
    "  --prompt-file FILE   with --memory-budget: prompt tokens from this text (real n-grams) instead of ids\n"
    "  --no-lookahead       with --memory-budget: no look-ahead prefetch (to measure what it brings)\n"
    "  --interleave N       an N-token prompt arriving while --decoders K (default 4) sequences decode:\n"
    "                       their inter-token gaps during its prefill, per --prefill-chunk LIST (default\n"
    "                       0,512; 0 = the whole prompt in one engine step), on one thread count (-t N)\n"
    "  --expert-parallel    under mpirun: the routed experts spread over the ranks, rank 0 benches\n"
    "                       (docs/DISTRIBUTED.md; one --numerics mode; not with --memory-budget or\n"
    "                       --interleave); --exchange-timeout S as for generate\n"
    "Each test starts a fresh sequence, prefills `depth` tokens (not timed), then times a prefill of\n"
    "`p` tokens (ppP) or `n` single-token decode steps (tgN).\n";

Result<std::vector<long long>> parse_list(const std::string& flag, const std::string& text) {
  std::vector<long long> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0) return invalid_argument(flag + ": expected non-negative integers, got '" + text + "'");
    out.push_back(v);
  }
  if (out.empty()) return invalid_argument(flag + ": empty list");
  return out;
}

// Best-of-`repeat` multi-threaded read bandwidth over a buffer much larger than the caches, read the
// way the GEMV kernels read weights: line by line with the same software prefetch
// (ops/simd/prefetch.h). A plain summing loop leaves the loads waiting on DRAM and reads less than the
// kernels do (12.0 against 16.2 GB/s with 1 thread on a 2-core Xeon): a limit that the decode then
// exceeds.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int repeat) {
  constexpr size_t kLine = 64 / sizeof(uint64_t);
  const size_t n = bytes / sizeof(uint64_t) / kLine * kLine;
  std::vector<uint64_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = i;  // touch every page
  std::vector<uint64_t> sums(pool.size() * 8, 0);
  double best = 0;
  for (int r = 0; r < repeat; ++r) {
    Timer t;
    pool.parallel_for(n / kLine, 64, [&](size_t b, size_t e, int tid) {
      uint64_t a[kLine] = {};
      for (size_t line = b; line < e; ++line) {
        const uint64_t* p = buf.data() + line * kLine;
        ops::prefetch_weight_stream(p);
        for (size_t j = 0; j < kLine; ++j) a[j] += p[j];
      }
      uint64_t total = 0;
      for (uint64_t v : a) total += v;
      sums[tid * 8] += total;
    });
    best = std::max(best, n * sizeof(uint64_t) / t.seconds());
  }
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  volatile uint64_t sink = total;  // keeps the reads from being optimised away
  (void)sink;
  return best;
}

// Best-of-`repeat` FLOP/s of the fast bf16-weight GEMM on operands that stay in cache: the machine's
// practical matmul peak for cedar's kernels (prefill FLOP/s are reported against it). 512 rows, as a
// prefill chunk has, so that decoding each weight panel is spread over as many rows as in prefill
// (on AMX the tiles are fast enough for a 96-row GEMM to measure mostly that decoding), and 1,024
// columns per thread, so that each thread's share of the columns still forms whole column groups.
double measure_gemm_peak(ThreadPool& pool, int repeat) {
  const size_t m = 512, n = 1024 * static_cast<size_t>(pool.size()), k = 512;
  std::vector<float> x(m * k), y(m * n);
  std::vector<uint16_t> w(n * k);
  for (size_t i = 0; i < x.size(); ++i) x[i] = ops::round_bf16(static_cast<float>((i * 37) % 17) / 16.0f - 0.5f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = ops::f32_to_bf16_bits(static_cast<float>((i * 53) % 13) / 64.0f);
  const ops::KernelSet& ks = ops::kernel_set(ops::Numerics::kFast);
  const ops::Bf16Weight wt{w.data(), n, k};
  double best = 0;
  for (int r = 0; r < repeat; ++r) {
    Timer t;
    constexpr int kCalls = 20;
    for (int c = 0; c < kCalls; ++c) ks.linear_bf16(x.data(), m, wt, y.data(), ops::LinearOut::kF32, &pool);
    best = std::max(best, 2.0 * m * n * k * kCalls / t.seconds());
  }
  return best;
}

struct Stats {
  double mean = 0, sd = 0;
};
Stats stats(const std::vector<double>& v) {
  Stats s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / static_cast<double>(v.size() - 1)) : 0.0;
  return s;
}

// A fixed prompt inside the tokenizer's range (the bench measures speed, not text).
std::vector<int32_t> bench_ids(size_t n, size_t offset, size_t vocab) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(((offset + i) * 7919 + 17) % vocab);
  return ids;
}

struct BenchResult {
  std::string numerics, test;
  int round = 0, threads = 0;
  long long depth = 0, tokens = 0;
  Stats tok_s;
  double gb_s = 0, bw_fraction = 0, gflop_s = 0, peak_fraction = 0;
};

// The read bandwidth a round measured before its runs with `threads` threads.
struct Probe {
  int round = 0, threads = 0;
  double bandwidth = 0;
};

// One test's speed with `threads` threads over its speed with the first thread count, round by round
// (--rounds), beside the same ratio of the two probes.
struct Scaling {
  std::string numerics, test;
  long long depth = 0;
  int threads = 0, base_threads = 0;
  std::vector<double> ratios, bandwidth_ratios;
};

std::vector<Scaling> scaling_by_round(const std::vector<BenchResult>& results, const std::vector<Probe>& probes,
                                      int base_threads) {
  const auto bandwidth = [&](int round, int threads) {
    for (const Probe& p : probes)
      if (p.round == round && p.threads == threads) return p.bandwidth;
    return 0.0;
  };
  std::vector<Scaling> out;
  for (const BenchResult& r : results) {
    if (r.threads == base_threads) continue;
    const BenchResult* base = nullptr;
    for (const BenchResult& b : results)
      if (b.round == r.round && b.threads == base_threads && b.numerics == r.numerics && b.test == r.test &&
          b.depth == r.depth)
        base = &b;
    if (base == nullptr || base->tok_s.mean <= 0) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const Scaling& s) {
      return s.numerics == r.numerics && s.test == r.test && s.depth == r.depth && s.threads == r.threads;
    });
    if (it == out.end()) it = out.insert(out.end(), Scaling{r.numerics, r.test, r.depth, r.threads, base_threads, {}, {}});
    it->ratios.push_back(r.tok_s.mean / base->tok_s.mean);
    const double base_bw = bandwidth(r.round, base_threads);
    it->bandwidth_ratios.push_back(base_bw > 0 ? bandwidth(r.round, r.threads) / base_bw : 0.0);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// tgN with the DSpark draft head: the greedy tokens of the plain tg loop (the same first token and
// argmax), decoded by verify passes where the guard lets the draft run and single steps elsewhere.
Status decode_speculative(model::Model& m, runtime::Speculator& spec, runtime::Speculator::Sequence& s,
                          model::SequenceState& seq, long long depth, long long n, std::vector<float>& logits,
                          ThreadPool& pool) {
  runtime::GenerationRequest req;
  req.sampling.temperature = 0;
  req.sampling.ignore_eos = true;
  req.sampling.max_tokens = static_cast<int>(n);
  runtime::Sampler sampler(req, m.sampleable_vocab(), m.config().eos_token_id);
  std::vector<int32_t> tokens;
  int32_t next = static_cast<int32_t>((depth * 31 + 5) % static_cast<long long>(m.sampleable_vocab()));
  // The plain loop runs n forwards and takes the argmax of each: n tokens of input. Here the last
  // input is the n-th token as well: a pass may emit up to (n - done) more.
  for (long long done = 0; done < n;) {
    if (done > 0) {
      CEDAR_ASSIGN_OR_RETURN(bool ran, spec.step(s, seq, next, sampler, 0.0f, static_cast<int>(n - done), &tokens, &pool));
      if (ran) {
        done += static_cast<long long>(tokens.size());
        next = tokens.back();
        continue;
      }
    }
    model::SeqChunk ch{&seq, {&next, 1}};
    CEDAR_RETURN_IF_ERROR(m.forward({&ch, 1}, logits.data(), &pool));
    spec.observe(s, 0, &pool);
    next = ops::argmax(logits.data(), m.sampleable_vocab());
    ++done;
  }
  return Status();
}

int cmd_bench(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--model", "--n-prompt", "--n-gen", "--depth", "--threads", "--repetitions",
                                 "--numerics", "--output", "--memory-budget", "--fio-bandwidth", "--residency-stats",
                                 "--prompt-file", "--rounds", "--interleave", "--decoders", "--prefill-chunk",
                                 "--speculative", kExpertParallelFlags[0]},
                          {"--help", "--no-lookahead", "--no-warmup", "--expert-parallel"},
                          {{"-m", "--model"}, {"-p", "--n-prompt"}, {"-n", "--n-gen"}, {"-d", "--depth"},
                           {"-t", "--threads"}, {"-r", "--repetitions"}, {"-o", "--output"}});
  if (!args.ok()) {
    std::fprintf(stderr, "cedar bench: %s\n%s", args.status().message().c_str(), kUsage);
    return 2;
  }
  if (args->has("--help") || !args->has("--model")) {
    std::printf("%s", kUsage);
    return args->has("--help") ? 0 : 2;
  }
  if (args->has("--expert-parallel") && (args->has("--interleave") || args->has("--memory-budget"))) {
    std::fprintf(stderr, "cedar bench: --expert-parallel runs the resident bench: drop --interleave / --memory-budget\n");
    return 2;
  }
  if (args->has("--interleave")) return bench_interleave(*args);
  if (args->has("--memory-budget")) {
    // The streaming bench runs one sequence per budget and has no sweep to repeat.
    for (const char* flag : {"--rounds", "--no-warmup"})
      if (args->has(flag)) {
        std::fprintf(stderr, "cedar bench: %s applies to the resident bench; drop it or --memory-budget\n", flag);
        return 2;
      }
    return bench_streaming(*args);
  }
  auto prompts = parse_list("-p", args->get_or("--n-prompt", "512"));
  auto gens = parse_list("-n", args->get_or("--n-gen", "128"));
  auto depths = parse_list("-d", args->get_or("--depth", "0"));
  auto threads = parse_list("-t", args->get_or("--threads", std::to_string(hardware_threads())));
  auto reps = args->get_int("--repetitions", 3);
  auto rounds = args->get_int("--rounds", 1);
  const std::string format = args->get_or("--output", "md");
  for (const Status* st :
       {&prompts.status(), &gens.status(), &depths.status(), &threads.status(), &reps.status(), &rounds.status()}) {
    if (!st->ok()) {
      std::fprintf(stderr, "cedar bench: %s\n", st->message().c_str());
      return 2;
    }
  }
  if (*reps < 1 || *rounds < 1 || (format != "md" && format != "json")) {
    std::fprintf(stderr, "cedar bench: -r and --rounds must be >= 1 and -o md or json\n");
    return 2;
  }
  std::vector<ops::Numerics> modes;
  {
    std::stringstream ss(args->get_or("--numerics", "fast"));
    std::string item;
    while (std::getline(ss, item, ',')) {
      auto m = ops::parse_numerics(item);
      if (!m) {
        std::fprintf(stderr, "cedar bench: --numerics takes fast and/or exact, got '%s'\n", item.c_str());
        return 2;
      }
      modes.push_back(*m);
    }
  }
  for (long long t : *threads)
    if (t < 1) {
      std::fprintf(stderr, "cedar bench: -t: thread counts must be >= 1\n");
      return 2;
    }

  const auto speculative = runtime::parse_speculative_mode(args->get_or("--speculative", "off"));
  if (!speculative) {
    std::fprintf(stderr, "cedar bench: --speculative must be 'auto', 'on' or 'off'\n");
    return 2;
  }
  model::ModelOptions mopts;  // the library's defaults; numerics are switched per mode below
  if (args->has("--expert-parallel")) {
    if (modes.size() != 1) {
      std::fprintf(stderr, "cedar bench: --expert-parallel benches one --numerics mode (the ranks load theirs once)\n");
      return 2;
    }
    mopts.numerics = modes[0];
  }
  // Expert parallelism: a worker rank serves the head inside this call and exits.
  auto expert_parallel = start_expert_parallel(*args, *args->get("--model"), &mopts, false);
  if (!expert_parallel.ok()) {
    std::fprintf(stderr, "cedar bench: %s\n", expert_parallel.status().message().c_str());
    return 1;
  }
  auto model = model::Model::load(*args->get("--model"), mopts);
  if (model.ok() && *expert_parallel) (*expert_parallel)->attach(**model);
  if (!model.ok()) {
    std::fprintf(stderr, "cedar bench: %s\n", model.status().message().c_str());
    return 1;
  }
  model::Model& m = **model;
  const model::ModelConfig& c = m.config();
  if (*speculative == runtime::SpeculativeMode::kOn && !m.draft_head()) {
    std::fprintf(stderr, "cedar bench: --speculative on needs a checkpoint with DSpark stages; use auto or off\n");
    return 2;
  }
  const bool dspark = *speculative != runtime::SpeculativeMode::kOff && m.draft_head();
  runtime::SpeculativeCounters spec_counters;
  const auto counts = model::count_params(model::weight_inventory(c));
  const auto plan = model::memory_plan(c, m.plan(), counts);
  // Matmul FLOPs of one prefill token: every active weight once (embedding lookup excluded).
  const double active_params =
      static_cast<double>(counts.backbone - counts.routed_expert_params) - static_cast<double>(c.vocab_size) * c.dim +
      static_cast<double>(counts.routed_expert_params) * c.n_activated_experts / std::max(1, c.n_routed_experts);
  const double flop_per_token = 2.0 * active_params;
  const size_t vocab = m.sampleable_vocab();
  std::vector<float> logits(c.vocab_size);

  // Weight bytes a decoded token reads under a kernel set: the plan's count, with the head at its
  // 12-bit size where the fast kernels read it re-coded (Model::set_numerics codes it, when it can).
  const auto decode_bytes = [&](ops::Numerics mode) {
    const ops::Bf16Weight& head = m.weights().head;
    int64_t bytes = plan.decode_bytes_per_token;
    if (mode == ops::Numerics::kFast && head.coded != nullptr)
      bytes += static_cast<int64_t>(head.coded->bytes()) - static_cast<int64_t>(head.n * head.k * 2);
    return bytes;
  };
  // The first thread count of the first round runs each test once untimed before its repetitions:
  // the same ids touch the same weight pages, which a fresh process has not faulted in yet (the first
  // decode of a 1.9 GB checkpoint ran 40 % slow).
  const bool warm_up = !args->has("--no-warmup");
  std::vector<BenchResult> results;
  std::vector<Probe> probes;
  nlohmann::json machine = nlohmann::json::array();
  for (long long round = 0; round < *rounds; ++round) {
    for (long long t : *threads) {
      ThreadPool pool(static_cast<int>(t));
      const double bandwidth = measure_read_bandwidth(pool, size_t{1} << 30, 3);
      const double peak = measure_gemm_peak(pool, 3);
      probes.push_back({static_cast<int>(round), static_cast<int>(t), bandwidth});
      machine.push_back({{"threads", t}, {"read_bandwidth_gb_s", bandwidth / 1e9}, {"gemm_peak_gflop_s", peak / 1e9}});
      if (*rounds > 1) machine.back()["round"] = round;
      if (format == "md")
        std::fprintf(stderr, "%sthreads %lld: memory read %.2f GB/s, fast bf16 GEMM peak %.1f GFLOP/s\n",
                     *rounds > 1 ? ("round " + std::to_string(round) + ", ").c_str() : "", t, bandwidth / 1e9,
                     peak / 1e9);
      for (ops::Numerics mode : modes) {
        m.set_numerics(mode);
        for (long long depth : *depths) {
          const auto run = [&](bool prefill, long long n, bool draft = false) -> Status {
            std::vector<double> rates;
            // One draft machinery per test: its guard carries what earlier repetitions learned.
            std::unique_ptr<runtime::Speculator> spec = draft ? runtime::Speculator::create(m) : nullptr;
            const bool warmup = warm_up && round == 0 && t == threads->front();
            for (long long r = warmup ? -1 : 0; r < *reps; ++r) {
              model::SequenceState seq = m.new_sequence(depth + n + 1);
              std::unique_ptr<runtime::Speculator::Sequence> spec_seq = spec ? spec->new_sequence(0) : nullptr;
              if (depth > 0) {
                const auto ctx = bench_ids(static_cast<size_t>(depth), 0, vocab);
                model::SeqChunk ch{&seq, ctx};
                CEDAR_RETURN_IF_ERROR(m.forward({&ch, 1}, logits.data(), &pool));
                if (spec) spec->observe(*spec_seq, 0, &pool);
              }
              Timer timer;
              if (draft) {
                CEDAR_RETURN_IF_ERROR(decode_speculative(m, *spec, *spec_seq, seq, depth, n, logits, pool));
                if (r >= 0) {
                  spec_counters.passes += spec_seq->counters.passes;
                  spec_counters.drafted += spec_seq->counters.drafted;
                  spec_counters.accepted += spec_seq->counters.accepted;
                }
              } else if (prefill) {
                const auto ids = bench_ids(static_cast<size_t>(n), static_cast<size_t>(depth), vocab);
                model::SeqChunk ch{&seq, ids};
                CEDAR_RETURN_IF_ERROR(m.forward({&ch, 1}, logits.data(), &pool));
              } else {
                int32_t next = static_cast<int32_t>((depth * 31 + 5) % static_cast<long long>(vocab));
                for (long long i = 0; i < n; ++i) {
                  model::SeqChunk ch{&seq, {&next, 1}};
                  CEDAR_RETURN_IF_ERROR(m.forward({&ch, 1}, logits.data(), &pool));
                  next = ops::argmax(logits.data(), vocab);
                }
              }
              if (r >= 0) rates.push_back(static_cast<double>(n) / timer.seconds());
            }
            BenchResult res;
            res.numerics = ops::numerics_name(mode);
            res.test = (prefill ? "pp" : "tg") + std::to_string(n) + (draft ? "+dspark" : "");
            res.round = static_cast<int>(round);
            res.threads = static_cast<int>(t);
            res.depth = depth;
            res.tokens = n;
            res.tok_s = stats(rates);
            if (prefill) {
              res.gflop_s = res.tok_s.mean * flop_per_token / 1e9;
              res.peak_fraction = res.gflop_s * 1e9 / peak;
            } else {
              res.gb_s = res.tok_s.mean * static_cast<double>(decode_bytes(mode)) / 1e9;
              res.bw_fraction = res.gb_s * 1e9 / bandwidth;
            }
            results.push_back(res);
            if (format == "md")
              std::fprintf(stderr, "  %s %s @ d%lld, %lld threads: %.2f tok/s\n", res.numerics.c_str(), res.test.c_str(),
                           depth, t, res.tok_s.mean);
            return Status();
          };
          for (long long p : *prompts)
            if (p > 0)
              if (Status st = run(true, p); !st.ok()) {
                std::fprintf(stderr, "cedar bench: %s\n", st.message().c_str());
                return 1;
              }
          for (long long n : *gens)
            for (bool draft : {false, true})
              if (n > 0 && (!draft || dspark))
                if (Status st = run(false, n, draft); !st.ok()) {
                  std::fprintf(stderr, "cedar bench: %s\n", st.message().c_str());
                  return 1;
                }
        }
      }
    }
  }
  const std::vector<Scaling> scalings = scaling_by_round(results, probes, static_cast<int>(threads->front()));
  if (format == "json") {
    nlohmann::json j = {{"model", *args->get("--model")},
                        {"weight_bytes_read_per_decoded_token",
                         {{"exact", decode_bytes(ops::Numerics::kExact)}, {"fast", decode_bytes(ops::Numerics::kFast)}}},
                        {"matmul_flop_per_prefill_token", flop_per_token},
                        {"machine", machine},
                        {"results", nlohmann::json::array()},
                        {"scaling", nlohmann::json::array()}};
    for (const BenchResult& r : results) {
      nlohmann::json e = {{"numerics", r.numerics}, {"test", r.test},      {"threads", r.threads},
                          {"depth", r.depth},       {"tokens", r.tokens},  {"tok_s_mean", r.tok_s.mean},
                          {"tok_s_sd", r.tok_s.sd}, {"repetitions", *reps}};
      if (*rounds > 1) e["round"] = r.round;
      if (r.test[0] == 't') {
        e["weight_gb_s"] = r.gb_s;
        e["bandwidth_fraction"] = r.bw_fraction;
      } else {
        e["gflop_s"] = r.gflop_s;
        e["gemm_peak_fraction"] = r.peak_fraction;
      }
      j["results"].push_back(e);
    }
    for (const Scaling& sc : scalings)
      j["scaling"].push_back({{"numerics", sc.numerics}, {"test", sc.test}, {"depth", sc.depth},
                              {"threads", sc.threads}, {"base_threads", sc.base_threads},
                              {"tok_s_ratio_by_round", sc.ratios}, {"tok_s_ratio_median", median(sc.ratios)},
                              {"read_bandwidth_ratio_by_round", sc.bandwidth_ratios}});
    if (dspark)
      j["speculative"] = {{"verify_passes", spec_counters.passes},
                          {"drafted", spec_counters.drafted},
                          {"accepted", spec_counters.accepted}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  if (dspark)
    std::printf("tgN+dspark (timed runs): %llu verify passes, %llu drafts verified, %llu accepted (%.2f per pass)\n",
                static_cast<unsigned long long>(spec_counters.passes),
                static_cast<unsigned long long>(spec_counters.drafted),
                static_cast<unsigned long long>(spec_counters.accepted),
                spec_counters.passes ? static_cast<double>(spec_counters.accepted) / spec_counters.passes : 0.0);
  std::printf("decode reads %.1f MB of weights per token", decode_bytes(ops::Numerics::kExact) / 1e6);
  if (m.weights().head.coded != nullptr)
    std::printf(" (%.1f MB in fast numerics: the head re-coded in 12 bits)", decode_bytes(ops::Numerics::kFast) / 1e6);
  std::printf("; prefill does %.2f GFLOP of matmuls per token\n\n", flop_per_token / 1e9);
  const bool by_round = *rounds > 1;
  std::printf("|%s numerics | threads | test | depth | tok/s | weights GB/s | %% of read bw | GFLOP/s | %% of GEMM peak |\n",
              by_round ? " round |" : "");
  std::printf("|%s---|---:|---|---:|---:|---:|---:|---:|---:|\n", by_round ? "---:|" : "");
  for (const BenchResult& r : results) {
    if (by_round) std::printf("| %d ", r.round);
    const bool tg = r.test[0] == 't';
    char a[32], b[32], cc[32], d[32];
    std::snprintf(a, sizeof a, "%.2f", r.gb_s);
    std::snprintf(b, sizeof b, "%.1f%%", 100.0 * r.bw_fraction);
    std::snprintf(cc, sizeof cc, "%.1f", r.gflop_s);
    std::snprintf(d, sizeof d, "%.1f%%", 100.0 * r.peak_fraction);
    std::printf("| %s | %d | %s | %lld | %.2f ± %.2f | %s | %s | %s | %s |\n", r.numerics.c_str(), r.threads,
                r.test.c_str(), r.depth, r.tok_s.mean, r.tok_s.sd, tg ? a : "", tg ? b : "", tg ? "" : cc, tg ? "" : d);
  }
  if (!scalings.empty()) {
    std::printf("\nspeed over %d thread%s, round by round (each round runs every thread count in turn)\n\n",
                scalings.front().base_threads, scalings.front().base_threads == 1 ? "" : "s");
    std::printf("| numerics | test | depth | threads | tok/s ratio per round | median | min | max | read bw ratio per round |\n");
    std::printf("|---|---|---:|---:|---|---:|---:|---:|---|\n");
    const auto join = [](const std::vector<double>& v) {
      std::string out;
      for (double x : v) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.2f", out.empty() ? "" : " / ", x);
        out += buf;
      }
      return out;
    };
    for (const Scaling& sc : scalings)
      std::printf("| %s | %s | %lld | %d | %s | %.2f | %.2f | %.2f | %s |\n", sc.numerics.c_str(), sc.test.c_str(),
                  sc.depth, sc.threads, join(sc.ratios).c_str(), median(sc.ratios),
                  *std::min_element(sc.ratios.begin(), sc.ratios.end()),
                  *std::max_element(sc.ratios.begin(), sc.ratios.end()), join(sc.bandwidth_ratios).c_str());
  }
  return 0;
}

}  // namespace

CEDAR_COMMAND("bench", "llama-bench style prefill/decode speed vs measured bandwidth and GEMM peak", cmd_bench);

}  // namespace cedar::cli
