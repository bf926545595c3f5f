// ops_harness: the op registry from the command line (docs/OPS.md).
//   ops_harness [--filter WORDS] [--all] [--target NAME]          correctness (the default)
//   ops_harness --perf [--filter WORDS] [--all] [--threads N] [--copies N] [--min-ms N] [--target NAME]
//   ops_harness --support                                          targets and x86 forms on this CPU
//   ops_harness --list [--filter WORDS]                            cases, bounds, bytes, FLOPs
// Correctness runs the cases that are not perf-only (--all: every case); --perf times the released
// shapes (--filter or --all: those selected) on the CPU's best target unless --target names another.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "op_registry.h"
#include "ops/simd/simd_info.h"
#include "ops/simd/x86_features.h"

namespace cedar::ops::testing {
namespace {

struct Args {
  bool perf = false, support = false, list = false, all = false;
  std::string filter, target;
  int threads = 1, copies = 1;
  double min_ms = 200;
};

int usage(const char* why) {
  std::fprintf(stderr,
               "%s\nusage: ops_harness [--perf | --support | --list] [--filter WORDS] [--all] [--target NAME]\n"
               "                   [--threads N (0 = all)] [--copies N] [--min-ms N]\n",
               why);
  return 2;
}

std::vector<const OpCase*> select(const Args& a) {
  std::vector<const OpCase*> out;
  for (const OpCase& c : op_cases()) {
    if (!matches(c, a.filter)) continue;
    if (a.list || a.all) {
      out.push_back(&c);
    } else if (a.perf) {
      if (c.released || !a.filter.empty()) out.push_back(&c);
    } else if (!c.perf_only) {
      out.push_back(&c);
    }
  }
  return out;
}

const char* yes(bool b) { return b ? "yes" : "no"; }

int support() {
  std::printf("CPU features: avx512-vnni %s, avx512-bf16 %s, avx512-bf16+vbmi %s, fast avx512-bf16 dot (AMD) %s\n",
              yes(x86::has_avx512_vnni()), yes(x86::has_avx512_bf16()), yes(x86::has_avx512_bf16_vbmi()),
              yes(x86::has_fast_avx512_bf16_dot()));
  std::string compiled, supported;
  for (const auto& t : compiled_simd_targets()) compiled += " " + t;
  for (const auto& t : supported_simd_targets()) supported += " " + t;
  std::printf("Highway targets compiled:%s\nHighway targets supported here:%s\ndispatched: %s\n", compiled.c_str(),
              supported.c_str(), dispatched_simd_target().c_str());
  std::printf("x86 forms the registry runs, per target (fast kernels; no-indexer-tiles-vnni: the indexer):\n");
  for (const KernelForm& form : kernel_forms()) {
    std::string where;
    for_each_target([&](const std::string& target) {
      if (form.applies(target)) where += " " + target;
    });
    std::printf("  %-24s%s\n", form.name, where.empty() ? " (not on this CPU)" : where.c_str());
  }
  return 0;
}

int list(const std::vector<const OpCase*>& cases) {
  for (const OpCase* c : cases)
    std::printf("%-48s %s%s bytes %.0f flops %.0f | %s\n", c->name.c_str(), c->released ? "[V4.1]" : "",
                c->perf_only ? "[perf]" : "", c->bytes, c->flops, c->bound.c_str());
  return 0;
}

int check(const Args& a, const std::vector<const OpCase*>& cases) {
  ThreadPool pool(3);
  size_t failed = 0;
  for (const OpCase* c : cases) {
    const auto failures = check_case(*c, &pool, a.target);
    for (const auto& f : failures) std::printf("FAIL %s\n", f.c_str());
    if (failures.empty()) std::printf("ok   %s\n", c->name.c_str());
    failed += !failures.empty();
  }
  std::printf("%zu cases, %zu failed\n", cases.size(), failed);
  return failed == 0 ? 0 : 1;
}

// The median time of one call, calling until min_ms have passed (at least 3 calls, after one warm-up).
double median_us(PreparedCase& p, const KernelSet& ks, ThreadPool* pool, double min_ms) {
  using Clock = std::chrono::steady_clock;
  p.run(ks, pool);
  std::vector<double> us;
  const auto start = Clock::now();
  while (us.size() < 3 || std::chrono::duration<double, std::milli>(Clock::now() - start).count() < min_ms) {
    const auto t0 = Clock::now();
    p.run(ks, pool);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (us.size() >= 100000) break;
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

int perf(const Args& a, const std::vector<const OpCase*>& cases) {
  ThreadPool pool(a.threads == 0 ? hardware_threads() : a.threads);
  std::printf("%-54s %-8s %-6s %-22s %11s %9s %10s   (threads %d, weight copies %d)\n", "case", "target", "mode",
              "form", "us", "GB/s", "GFLOP/s", a.threads == 0 ? hardware_threads() : a.threads, a.copies);
  for (const OpCase* c : cases) {
    PrepareOptions opt;
    opt.reference = false;
    opt.copies = a.copies;
    const auto p = c->prepare(opt);
    const std::string only = a.target.empty() ? dispatched_simd_target() : a.target;
    for_each_target(
        [&](const std::string& target) {
          if (!a.target.empty() || target == only) {
            for (Numerics mode : c->numerics) {
              const uint32_t reach = mode == Numerics::kFast ? c->reach : c->reach & kReachIndexTiles;
              for_each_form(reach, [&](const KernelForm& form) {
                const double us = median_us(*p, kernel_set(mode), &pool, a.min_ms);
                std::printf("%-54s %-8s %-6s %-22s %11.1f %9.2f %10.2f\n", c->name.c_str(), target.c_str(),
                            numerics_name(mode), form.name, us, c->bytes / us * 1e-3, c->flops / us * 1e-3);
                std::fflush(stdout);
              });
            }
          }
        },
        a.target);
  }
  return 0;
}

int main_impl(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--perf") {
      a.perf = true;
    } else if (arg == "--support") {
      a.support = true;
    } else if (arg == "--list") {
      a.list = true;
    } else if (arg == "--all") {
      a.all = true;
    } else if (arg == "--filter" || arg == "--target" || arg == "--threads" || arg == "--copies" || arg == "--min-ms") {
      const char* v = value();
      if (v == nullptr) return usage((arg + " needs a value").c_str());
      if (arg == "--filter") a.filter = v;
      if (arg == "--target") a.target = v;
      if (arg == "--threads") a.threads = std::atoi(v);
      if (arg == "--copies") a.copies = std::max(1, std::atoi(v));
      if (arg == "--min-ms") a.min_ms = std::atof(v);
    } else if (arg == "--help" || arg == "-h") {
      return usage("ops_harness: the op registry (docs/OPS.md)");
    } else {
      return usage(("unknown argument " + arg).c_str());
    }
  }
  if (a.support) return support();
  const auto cases = select(a);
  if (cases.empty()) return usage(("no case matches --filter '" + a.filter + "' (--list shows them)").c_str());
  if (a.list) return list(cases);
  return a.perf ? perf(a, cases) : check(a, cases);
}

}  // namespace
}  // namespace cedar::ops::testing

int main(int argc, char** argv) { return cedar::ops::testing::main_impl(argc, argv); }
