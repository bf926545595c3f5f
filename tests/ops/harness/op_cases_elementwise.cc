// Registry cases of the per-token ops: the mHC mixes (exact: bitwise equal to ref::hc_mixes; fast:
// the float64-reordering bound of hc_moe_sample_test.cc), the experts' clamped SwiGLU (exact: bitwise
// equal to the definition of moe.h restated here; fast: one bf16 step) and RMSNorm (one kernel, bitwise
// equal to ref::rms_norm).
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "op_registry.h"
#include "ops/formats/formats.h"
#include "ops/block/hc.h"
#include "ops/block/moe.h"
#include "ops/block/norm.h"
#include "ops_test_util.h"

namespace cedar::ops::testing {
namespace {

class HcMixes : public PreparedCase {
 public:
  HcMixes(size_t tokens, size_t hc_dim, size_t n_mix, const std::string& name, const PrepareOptions& opt)
      : tokens_(tokens), hc_dim_(hc_dim), n_mix_(n_mix) {
    Rng rng(seed_of(name.c_str()));
    x_ = random_bf16(tokens * hc_dim, rng);
    fn_.resize(n_mix * hc_dim);
    for (auto& v : fn_) v = rng.normal(0.0f, 0.05f);
    out = GuardedFloats(tokens * n_mix);
    if (!opt.reference) return;
    want.resize(tokens * n_mix);
    ref::hc_mixes(x_.data(), tokens, hc_dim, fn_.data(), n_mix, kHcNormEps, want.data());
    // fast sums in float64 registers in another order: r·(hc_dim + 1)·2^-53·Σ|x·fn| plus an fp32
    // rounding of each side (the dot rounded once to fp32, then ·r).
    fast_bound.resize(want.size());
    for (size_t t = 0; t < tokens; ++t) {
      double ss = 0;
      for (size_t i = 0; i < hc_dim; ++i) ss += static_cast<double>(x_[t * hc_dim + i]) * x_[t * hc_dim + i];
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(hc_dim));
      for (size_t j = 0; j < n_mix; ++j) {
        double abs_sum = 0;
        for (size_t i = 0; i < hc_dim; ++i)
          abs_sum += std::fabs(static_cast<double>(x_[t * hc_dim + i]) * fn_[j * hc_dim + i]);
        fast_bound[t * n_mix + j] =
            1.01 * (r * (hc_dim + 1.0) * 0x1p-53 * abs_sum + 2 * 0x1p-24 * std::fabs(want[t * n_mix + j])) + 1e-30;
      }
    }
  }
  void run(const KernelSet& ks, ThreadPool* pool) override {
    ks.hc_mixes(x_.data(), tokens_, hc_dim_, fn_.data(), n_mix_, kHcNormEps, out.data(), pool);
  }

 private:
  size_t tokens_, hc_dim_, n_mix_;
  std::vector<float> x_, fn_;
};

// swiglu_clamped as moe.h defines it: u = clamp(u, -limit, limit); g = min(g, limit) (limit > 0);
// silu(g) in double rounded once; a = silu(g) * u; a = weight * a (f32); out = bf16(a). The clamps
// as std::min / std::max evaluate them, so NaN passes through.
float swiglu_definition(float g, float u, float limit, float weight) {
  if (limit > 0.0f) {
    u = std::min(std::max(u, -limit), limit);
    g = std::min(g, limit);
  }
  const double gd = g;
  const float silu = static_cast<float>(gd / (1.0 + std::exp(-gd)));
  const float a = silu * u;
  return round_bf16(weight * a);
}

// Ordered bf16 steps between two values of the same sign.
int bf16_steps(float a, float b) {
  const auto key = [](float v) {
    const int32_t h = static_cast<int32_t>(bits_of(v) >> 16);
    return h & 0x8000 ? -(h & 0x7FFF) : h;
  };
  return std::abs(key(a) - key(b));
}

class Swiglu : public PreparedCase {
 public:
  Swiglu(size_t n, float weight, const std::string& name, const PrepareOptions& opt) : n_(n), weight_(weight) {
    Rng rng(seed_of(name.c_str()));
    g_.resize(n);
    u_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      g_[i] = round_bf16(i % 4 == 0 ? rng.uniform(-120.0f, 120.0f) : rng.normal(0.0f, 4.0f));
      u_[i] = round_bf16(rng.normal(0.0f, 4.0f));
    }
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    const float specials[][2] = {{0.0f, 1.0f}, {-0.0f, 1.0f}, {inf, 1.0f},     {-inf, 1.0f},
                                 {nan, 1.0f},  {1.0f, nan},   {-300.0f, 2.0f}, {88.7f, -3.0f}};
    for (size_t i = 0; i < std::size(specials) && i < n; ++i) g_[i] = specials[i][0], u_[i] = specials[i][1];
    out = GuardedFloats(n);
    if (!opt.reference) return;
    want.resize(n);
    for (size_t i = 0; i < n; ++i) want[i] = swiglu_definition(g_[i], u_[i], kLimit, weight);
  }
  void run(const KernelSet& ks, ThreadPool*) override {
    ks.swiglu_clamped(g_.data(), u_.data(), n_, kLimit, weight_, out.data());
  }
  // Exact: bitwise. Fast: NaN where exact is NaN, else equal or one bf16 step apart (within 2^-100
  // below 2^-100), and at most 1% of the outputs differing.
  std::string check(Numerics mode) const override {
    if (mode == Numerics::kExact) return PreparedCase::check(mode);
    size_t differ = 0;
    for (size_t i = 0; i < n_; ++i) {
      const float got = out.data()[i];
      std::ostringstream err;
      err << "@" << i << " g " << g_[i] << " u " << u_[i] << " got " << got << " want " << want[i];
      if (std::isnan(want[i])) {
        if (!std::isnan(got)) return err.str();
        continue;
      }
      differ += bits_of(got) != bits_of(want[i]);
      if (std::fabs(want[i]) < 0x1p-100f ? !(std::fabs(got - want[i]) <= 0x1p-100f) : bf16_steps(got, want[i]) > 1)
        return err.str();
    }
    if (differ > n_ / 100) return std::to_string(differ) + " outputs differ (more than 1%)";
    return "";
  }

 private:
  static constexpr float kLimit = 10.0f;  // swiglu_limit
  size_t n_;
  float weight_;
  std::vector<float> g_, u_;
};

class RmsNorm : public PreparedCase {
 public:
  RmsNorm(size_t rows, size_t dim, const std::string& name, const PrepareOptions& opt) : rows_(rows), dim_(dim) {
    Rng rng(seed_of(name.c_str()));
    x_ = random_bf16(rows * dim, rng, 3.0f);
    w_ = random_bf16(dim, rng);
    out = GuardedFloats(rows * dim);
    if (!opt.reference) return;
    want.resize(rows * dim);
    ref::rms_norm(x_.data(), rows, dim, w_.data(), kRmsNormEpsV41, want.data());
  }
  void run(const KernelSet&, ThreadPool*) override {
    rms_norm(x_.data(), rows_, dim_, w_.data(), kRmsNormEpsV41, out.data());
  }

 private:
  size_t rows_, dim_;
  std::vector<float> x_, w_;
};

}  // namespace

void add_elementwise_cases(std::vector<OpCase>& cases) {
  struct HcShape {
    size_t tokens, hc_dim, n_mix;
    bool released = false, perf_only = false;
  };
  // Token counts that fill the 4-token tiles and leave short ones, mix counts with a short group,
  // hc_dim with a tail below one vector; released: hc_mult 4 streams of 5120, 24 mixes.
  for (const HcShape& s : std::initializer_list<HcShape>{{1, 4 * 640, 24},
                                                         {7, 4 * 640, 24},
                                                         {9, 4 * 100 + 3, 23},
                                                         {4, 20, 5},
                                                         {1, 4 * 5120, 24, true},
                                                         {64, 4 * 5120, 24, true, true}}) {
    add_case<HcMixes>(
        cases,
        {.name = "hc_mixes tokens=" + std::to_string(s.tokens) + " hc_dim=" + std::to_string(s.hc_dim) +
                 " mixes=" + std::to_string(s.n_mix),
         .op = "hc_mixes",
         .numerics = {Numerics::kExact, Numerics::kFast},
         .released = s.released,
         .perf_only = s.perf_only,
         .bound = "exact: bitwise = ref::hc_mixes; fast: 1.01*(r*(hc_dim+1)*2^-53*sum|x*fn| + 2*2^-24*|want|)",
         .bytes = 4.0 * (s.tokens * s.hc_dim + s.n_mix * s.hc_dim + s.tokens * s.n_mix),
         .flops = 2.0 * s.tokens * s.hc_dim * (s.n_mix + 1)},
        s.tokens, s.hc_dim, s.n_mix);
  }
  // A tail for every vector width; released: a routed expert (weight != 1) and the shared one over
  // moe_inter_dim 2304.
  for (const auto& [n, weight, released] : {std::tuple<size_t, float, bool>{20013, 0.37f, false},
                                            {20013, 1.0f, false},
                                            {2304, 0.37f, true},
                                            {2304, 1.0f, true}}) {
    add_case<Swiglu>(cases,
                     {.name = "swiglu_clamped n=" + std::to_string(n) + (weight == 1.0f ? " weight=1" : " weight=0.37"),
                      .op = "swiglu_clamped",
                      .numerics = {Numerics::kExact, Numerics::kFast},
                      .released = released,
                      .bound = "exact: bitwise = the definition of moe.h; fast: one bf16 step, <= 1% differing",
                      .bytes = 12.0 * n,
                      .flops = 8.0 * n},
                     n, weight);
  }
  for (const auto& [rows, dim, released] : {std::tuple<size_t, size_t, bool>{3, 7, false},
                                            {3, 1000, false},
                                            {1, 5120, true},
                                            {1, 1280, true},  // q_norm over q_lora_rank
                                            {1, 512, true},   // kv_norm
                                            {64, 5120, true}}) {
    add_case<RmsNorm>(cases,
                      {.name = "rms_norm rows=" + std::to_string(rows) + " dim=" + std::to_string(dim),
                       .op = "rms_norm",
                       .numerics = {Numerics::kExact},  // one kernel for both modes
                       .released = released,
                       .bound = "bitwise = ref::rms_norm",
                       .bytes = 8.0 * rows * dim + 4.0 * dim,
                       .flops = 4.0 * rows * dim},
                      rows, dim);
  }
}

}  // namespace cedar::ops::testing
