// One registry of op cases, run over every Highway target this CPU supports and, per target, every x86
// kernel form the op can reach (in the spirit of llama.cpp's test-backend-ops crossed with gemma.cpp's
// every-target tests). docs/OPS.md says how to run it.
//
// A case is one op at one shape: a printable name that doubles as a filter ("linear_fp8 m=1 k=4096
// n=1024"), the kernel sets (exact, fast) it runs, the bound its output is checked with, its bytes
// and FLOPs. Preparing a case draws its inputs from a PortableRng seeded by its name and computes the
// scalar reference once; the runner then runs the kernel under test into outputs with guard words on
// both sides and compares: bitwise in exact mode, within the case's derived bound in fast mode, and
// bitwise between a run inline and a run on a thread pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ops/kernel_set.h"

namespace cedar {
class ThreadPool;
}

namespace cedar::ops::testing {

// Which x86 kernel forms an op can reach (a form that the op never runs is not repeated for it).
enum Reach : uint32_t {
  kReachFp8Gemv = 1,     // x86_fp8_gemv.h
  kReachFp4Gemv = 2,     // x86_fp4_gemv.h, its bf16 and VNNI forms
  kReachGemmTiles = 4,   // x86_gemm_bf16.h, x86_gemm_amx.h
  kReachIndexTiles = 8,  // x86_indexer_tiles.h
  kReachLinear = kReachFp8Gemv | kReachFp4Gemv | kReachGemmTiles,
};

// One x86 form: a switch of the x86 kernels away from what the CPU would take, applicable on some
// targets of some CPUs. "default" (nothing switched) always applies.
struct KernelForm {
  const char* name;
  uint32_t reach;
  bool (*applies)(const std::string& target);  // with the CPU's features and the dispatched target
  void (*enter)();
  void (*leave)();
};
// Every form, "default" first.
std::span<const KernelForm> kernel_forms();
// Runs fn(form) with each form switched on in turn: "default", then those reaching `reach` that
// apply to the dispatched target.
void for_each_form(uint32_t reach, const std::function<void(const KernelForm&)>& fn);

// Runs fn(target name) once per Highway target that is compiled in and supported by this CPU, with
// dispatch forced to it (then back to the CPU's best). `only` (non-empty): targets containing it.
void for_each_target(const std::function<void(const std::string&)>& fn, const std::string& only = "");

// A fixed-size float output with guard words on both sides. Before a run the output is filled with a
// poison NaN, so an element the kernel never wrote fails the comparison; after it the guards must be
// intact, so a write out of bounds is caught.
class GuardedFloats {
 public:
  static constexpr size_t kGuard = 64;
  explicit GuardedFloats(size_t n = 0);
  float* data() { return buf_.data() + kGuard; }
  const float* data() const { return buf_.data() + kGuard; }
  size_t size() const { return n_; }
  void poison();
  bool guards_intact() const;

 private:
  size_t n_;
  std::vector<float> buf_;
};

// A case's state once prepared: inputs, the reference and the output under test.
class PreparedCase {
 public:
  virtual ~PreparedCase() = default;
  // Runs the op of `ks` once into `out` (pool may be nullptr: inline).
  virtual void run(const KernelSet& ks, ThreadPool* pool) = 0;
  // The output after run() against the reference: "" when within the case's bound, else what failed.
  // By default: bitwise in exact mode; in fast mode |out - want| <= fast_bound + fast_rel * (|out| +
  // |want|) per element and a normalised mean squared error below 1e-4 (for bf16 outputs both sides
  // round to bf16: ~2^-18 expected).
  virtual std::string check(Numerics mode) const;

  GuardedFloats out;
  std::vector<float> want;         // the scalar reference (the exact op's definition)
  std::vector<double> fast_bound;  // per element, the derived bound of the fast kernels
  double fast_rel = 0;             // and its part relative to the two outputs (their final roundings)
};

struct PrepareOptions {
  bool reference = true;  // false (--perf): skip the reference and the bounds
  int copies = 1;         // --perf: weight copies cycled per call (8: a working set beyond the caches)
};

struct OpCase {
  std::string name{};                // "linear_fp8 m=1 k=4096 n=1024": the op, then its shape
  std::string op{};                  // "linear_fp8"
  std::vector<Numerics> numerics{};  // the kernel sets it runs
  uint32_t reach = 0;                // x86 forms it can reach
  bool released = false;             // a shape of the released V4.1 model
  bool perf_only = false;            // too large for the correctness sweep
  std::string bound{};               // how it is checked, in words
  double bytes = 0;                  // what one call reads and writes
  double flops = 0;                  // multiply-adds count 2
  std::function<std::unique_ptr<PreparedCase>(const PrepareOptions&)> prepare{};
};

// Appends case c, whose prepare builds T(args..., c.name, options).
template <typename T, typename... Args>
void add_case(std::vector<OpCase>& cases, OpCase c, Args... args) {
  c.prepare = [=, name = c.name](const PrepareOptions& o) { return std::make_unique<T>(args..., name, o); };
  cases.push_back(std::move(c));
}

// Every case, in a fixed order.
const std::vector<OpCase>& op_cases();
// Whether a case's name holds every space-separated word of `filter` ("" matches every case).
bool matches(const OpCase& c, const std::string& filter);

// The registry's correctness mode for one case: every target and form, both pool settings. Returns
// one line per failure ("" entries never; empty = pass).
std::vector<std::string> check_case(const OpCase& c, ThreadPool* pool, const std::string& only_target = "");

// The case builders, one file per op family (op_cases_*.cc).
void add_linear_cases(std::vector<OpCase>& cases);
void add_attention_cases(std::vector<OpCase>& cases);
void add_elementwise_cases(std::vector<OpCase>& cases);

}  // namespace cedar::ops::testing
