// Microbenchmarks of the ops: the op registry's cases (tests/ops/harness/op_registry.h, docs/OPS.md)
// under Google Benchmark, one benchmark per released V4.1 shape, kernel set and thread count (the
// x86 forms and the other targets: ops_harness --perf). Bytes/s count what a call reads and writes;
// GFLOP/s its multiply-adds as 2. The linears cycle through 8 weight copies on 2 MiB pages, so that
// the working set exceeds the last-level cache as a real model's weights do ("cold"), and through one
// ("hot", as ggml's test-backend-ops measures).
// Run: build/bench/cedar_bench --benchmark_filter=Ops
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "harness/op_registry.h"

namespace cedar::ops {
namespace {

using testing::OpCase;

ThreadPool* pool_for(int threads) {
  static ThreadPool one(1), two(2);
  return threads == 1 ? &one : &two;
}

void run_case(benchmark::State& state, const OpCase* c, Numerics mode, int threads, int copies) {
  testing::PrepareOptions opt;
  opt.reference = false;
  opt.copies = copies;
  const auto p = c->prepare(opt);
  const KernelSet& ks = kernel_set(mode);
  ThreadPool* pool = pool_for(threads);
  for (auto _ : state) {
    p->run(ks, pool);
    benchmark::DoNotOptimize(p->out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * c->bytes));
  state.counters["FLOPS"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * c->flops, benchmark::Counter::kIsRate);
}

const bool kRegistered = [] {
  for (const OpCase& c : testing::op_cases()) {
    if (!c.released) continue;
    const bool linear = c.op.rfind("linear", 0) == 0;
    for (Numerics mode : c.numerics)
      for (int threads : {1, 2})
        for (int copies : linear ? std::vector<int>{8, 1} : std::vector<int>{1}) {
          const std::string name = "Ops/" + c.name + "/" + numerics_name(mode) + "/threads:" + std::to_string(threads) +
                                   (linear ? (copies > 1 ? "/cold" : "/hot") : "");
          benchmark::RegisterBenchmark(name.c_str(), run_case, &c, mode, threads, copies)
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
  }
  return true;
}();

}  // namespace
}  // namespace cedar::ops
