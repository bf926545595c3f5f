// cedar bench: the machine's memory read bandwidth, then prefill and decode speed of a checkpoint,
// reported as tokens/s and as the fraction of the measured bandwidth that decode achieves on the
// weight bytes it must read per token (decode is bandwidth bound: that ratio is the figure of merit).

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "args.h"
#include "command.h"
#include "core/thread_pool.h"
#include "core/timer.h"
#include "model/model.h"
#include "model/model_summary.h"
#include "model/weight_inventory.h"
#include "ops/sample.h"

namespace cedar::cli {
namespace {

constexpr const char* kUsage =
    "usage: cedar bench -m DIR [-p N] [-n N] [--threads K] [--repeat R] [--json]\n"
    "  -m, --model DIR   checkpoint directory\n"
    "  -p N              prompt tokens to prefill (default 128)\n"
    "  -n N              tokens to decode (default 32)\n"
    "  --threads K       worker threads (default: all cores)\n"
    "  --repeat R        repetitions; the best is reported (default 3)\n"
    "  --json            machine-readable output\n";

// Best-of-`repeat` multi-threaded read bandwidth over a buffer much larger than the caches.
double measure_read_bandwidth(ThreadPool& pool, size_t bytes, int repeat) {
  const size_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = i;  // touch every page
  std::vector<uint64_t> sums(pool.size() * 8, 0);
  double best = 0;
  for (int r = 0; r < repeat; ++r) {
    Timer t;
    pool.parallel_for(n, 4096, [&](size_t b, size_t e, int tid) {
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      size_t i = b;
      for (; i + 4 <= e; i += 4) {
        a0 += buf[i];
        a1 += buf[i + 1];
        a2 += buf[i + 2];
        a3 += buf[i + 3];
      }
      for (; i < e; ++i) a0 += buf[i];
      sums[tid * 8] += a0 + a1 + a2 + a3;
    });
    best = std::max(best, bytes / t.seconds());
  }
  uint64_t total = 0;
  for (uint64_t s : sums) total += s;
  volatile uint64_t sink = total;  // keeps the reads from being optimised away
  (void)sink;
  return best;
}

int cmd_bench(const std::vector<std::string>& argv) {
  auto args = Args::parse(argv, {"--model", "-p", "-n", "--threads", "--repeat"}, {"--json", "--help"},
                          {{"-m", "--model"}});
  if (!args.ok()) {
    std::fprintf(stderr, "cedar bench: %s\n%s", args.status().message().c_str(), kUsage);
    return 2;
  }
  if (args->has("--help") || !args->has("--model")) {
    std::printf("%s", kUsage);
    return args->has("--help") ? 0 : 2;
  }
  auto n_prompt = args->get_int("-p", 128), n_decode = args->get_int("-n", 32);
  auto threads = args->get_int("--threads", 0), repeat = args->get_int("--repeat", 3);
  if (!n_prompt.ok() || !n_decode.ok() || !threads.ok() || !repeat.ok() || *n_prompt < 1 || *n_decode < 1 ||
      *repeat < 1 || *threads < 0) {
    std::fprintf(stderr, "cedar bench: -p, -n, --repeat must be >= 1 and --threads >= 0\n");
    return 2;
  }
  auto model = model::Model::load(*args->get("--model"));
  if (!model.ok()) {
    std::fprintf(stderr, "cedar bench: %s\n", model.status().message().c_str());
    return 1;
  }
  model::Model& m = **model;
  ThreadPool pool(*threads > 0 ? static_cast<int>(*threads) : hardware_threads());
  const double bandwidth = measure_read_bandwidth(pool, size_t{1} << 30, static_cast<int>(*repeat));

  const auto counts = model::count_params(model::weight_inventory(m.config()));
  const auto plan = model::memory_plan(m.config(), m.plan(), counts);
  // Prompt: a fixed id sequence inside the tokenizer's range (the bench measures speed, not text).
  std::vector<int32_t> prompt(*n_prompt);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 17) % 100000);
  const size_t V = m.config().vocab_size;
  std::vector<float> logits(V);
  double best_prefill = 1e30, best_decode = 1e30;
  for (int r = 0; r < *repeat; ++r) {
    model::SequenceState seq = m.new_sequence(*n_prompt + *n_decode + 1);
    Timer t;
    model::SeqChunk c{&seq, prompt};
    if (Status st = m.forward({&c, 1}, logits.data(), &pool); !st.ok()) {
      std::fprintf(stderr, "cedar bench: %s\n", st.message().c_str());
      return 1;
    }
    best_prefill = std::min(best_prefill, t.seconds());
    int32_t next = ops::argmax(logits.data(), V);
    t.reset();
    for (int i = 0; i < *n_decode; ++i) {
      model::SeqChunk d{&seq, {&next, 1}};
      if (Status st = m.forward({&d, 1}, logits.data(), &pool); !st.ok()) {
        std::fprintf(stderr, "cedar bench: %s\n", st.message().c_str());
        return 1;
      }
      next = ops::argmax(logits.data(), V) % 100000;
    }
    best_decode = std::min(best_decode, t.seconds());
  }
  const double prefill_tps = *n_prompt / best_prefill, decode_tps = *n_decode / best_decode;
  const double decode_bytes_s = decode_tps * static_cast<double>(plan.decode_bytes_per_token);
  if (args->has("--json")) {
    nlohmann::json j = {{"threads", pool.size()}, {"prompt_tokens", *n_prompt}, {"decode_tokens", *n_decode},
                        {"read_bandwidth_gb_s", bandwidth / 1e9}, {"prefill_tok_s", prefill_tps},
                        {"decode_tok_s", decode_tps}, {"decode_weight_bytes_per_token", plan.decode_bytes_per_token},
                        {"decode_weight_gb_s", decode_bytes_s / 1e9}, {"bandwidth_ratio", decode_bytes_s / bandwidth}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("threads %d | memory read %.2f GB/s | prefill %lld tok: %.2f tok/s | decode %lld tok: %.2f tok/s\n",
                pool.size(), bandwidth / 1e9, static_cast<long long>(*n_prompt), prefill_tps,
                static_cast<long long>(*n_decode), decode_tps);
    std::printf("decode reads %.1f MB of weights per token -> %.2f GB/s = %.1f%% of measured read bandwidth\n",
                plan.decode_bytes_per_token / 1e6, decode_bytes_s / 1e9, 100.0 * decode_bytes_s / bandwidth);
  }
  return 0;
}

}  // namespace

CEDAR_COMMAND("bench", "measure memory bandwidth, prefill and decode speed of a checkpoint", cmd_bench);

}  // namespace cedar::cli
