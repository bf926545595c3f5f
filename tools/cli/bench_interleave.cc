#include "bench_interleave.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "cedar/platform.h"
#include "cedar/engine.h"

namespace cedar::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> ids_for(size_t n, size_t salt, int vocab) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(((salt * 131 + i) * 7919 + 17) % vocab);
  return ids;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
}

struct Run {
  double ttft = 0;                 // the long prompt's time to first token
  std::vector<double> gaps_ms;     // decoders' inter-token gaps that overlap its prefill
};

Result<Run> run_once(const std::string& model_dir, int threads, int decoders, size_t prompt, int chunk) {
  runtime::EngineOptions o;
  o.threads = threads;
  o.max_batch = decoders + 1;
  o.max_context = static_cast<int>(prompt) + 4096;
  o.prefill_chunk = chunk;
  o.prefix_cache = false;
  o.numerics = ops::Numerics::kFast;
  CEDAR_ASSIGN_OR_RETURN(auto engine, runtime::make_engine(model_dir, o));
  const int vocab = engine->info().vocab_size;
  // The decoders: each records when its tokens arrive (on its own reader thread).
  std::vector<std::shared_ptr<runtime::GenerationStream>> streams;
  std::vector<std::vector<Clock::time_point>> arrivals(decoders);
  for (int d = 0; d < decoders; ++d) {
    runtime::GenerationRequest r;
    r.prompt_ids = ids_for(16, d + 1, vocab);
    r.sampling.max_tokens = 4000;
    r.sampling.ignore_eos = true;
    CEDAR_ASSIGN_OR_RETURN(auto s, engine->submit(r));
    streams.push_back(s);
  }
  std::vector<std::thread> readers;
  for (int d = 0; d < decoders; ++d)
    readers.emplace_back([&, d] {
      for (;;) {
        runtime::GenerationStream::Update u = streams[d]->next();
        if (!u.tokens.empty()) arrivals[d].push_back(Clock::now());
        if (u.finished) return;
      }
    });
  // Let every decoder reach steady decoding (a few tokens each), then the long prompt arrives.
  for (int d = 0; d < decoders; ++d)
    while (arrivals[d].size() < 4 && !streams[d]->cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  runtime::GenerationRequest big;
  big.prompt_ids = ids_for(prompt, 999, vocab);
  big.sampling.max_tokens = 1;
  const Clock::time_point start = Clock::now();
  CEDAR_ASSIGN_OR_RETURN(runtime::GenerationResult res, runtime::generate(*engine, big));
  const Clock::time_point end = Clock::now();
  for (auto& s : streams) s->cancel();
  for (auto& t : readers) t.join();
  Run run;
  run.ttft = std::chrono::duration<double>(end - start).count();
  (void)res;
  for (const auto& a : arrivals)
    for (size_t i = 1; i < a.size(); ++i)
      if (a[i] > start && a[i - 1] < end)  // a gap that overlaps the prefill
        run.gaps_ms.push_back(std::chrono::duration<double, std::milli>(a[i] - a[i - 1]).count());
  return run;
}

}  // namespace

int bench_interleave(const Args& args) {
  auto prompt = args.get_int("--interleave", 16384);
  auto decoders = args.get_int("--decoders", 4);
  auto threads = args.get_int("--threads", hardware_threads());
  if (!prompt.ok() || !decoders.ok() || !threads.ok() || *prompt < 1 || *decoders < 1 || *threads < 1) {
    std::fprintf(stderr, "cedar bench: --interleave, --decoders and --threads take positive numbers\n");
    return 2;
  }
  std::vector<int> chunks;
  std::stringstream ss(args.get_or("--prefill-chunk", "0,512"));
  for (std::string item; std::getline(ss, item, ',');) chunks.push_back(std::atoi(item.c_str()));
  std::printf("| prefill chunk | prompt | decoders | threads | prompt TTFT s | decoder gap median ms | p99 ms | max ms |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int chunk : chunks) {
    auto run = run_once(*args.get("--model"), static_cast<int>(*threads), static_cast<int>(*decoders),
                        static_cast<size_t>(*prompt), chunk);
    if (!run.ok()) {
      std::fprintf(stderr, "cedar bench: %s\n", run.status().message().c_str());
      return 1;
    }
    std::printf("| %d | %lld | %lld | %lld | %.2f | %.1f | %.1f | %.1f |\n", chunk, static_cast<long long>(*prompt),
                static_cast<long long>(*decoders), static_cast<long long>(*threads), run->ttft,
                quantile(run->gaps_ms, 0.5), quantile(run->gaps_ms, 0.99), quantile(run->gaps_ms, 1.0));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace cedar::cli
