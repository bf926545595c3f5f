// Registry cases of the linears (ops/linear/linear.h through the kernel set): block-scaled FP8 and FP4, the
// FP8 weight read as bf16, bf16 (plain and 12-bit coded) and f32 weights. Exact: bitwise equal to the
// scalar references (ref::). Fast: the derived fp32-summation bound of docs/NUMERICS.md ("Fast
// numerics"), the one linear_fast_test.cc and linear_fast_dense_test.cc check with.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/huge_pages.h"
#include "op_registry.h"
#include "ops/linear/bf16_coded.h"
#include "ops/linear/activation_access.h"
#include "ops/formats/formats.h"
#include "ops/linear/linear_fast.h"
#include "ops/formats/quant.h"
#include "ops_test_util.h"

namespace cedar::ops::testing {
namespace {

struct LinearShape {
  size_t m, k, n;
  bool released = false, perf_only = false;
};

std::string shape_name(const char* op, const LinearShape& s, const std::string& extra = "") {
  return std::string(op) + (extra.empty() ? "" : " " + extra) + " m=" + std::to_string(s.m) +
         " k=" + std::to_string(s.k) + " n=" + std::to_string(s.n);
}

// FP8 weights as a checkpoint holds them: normal values (sd 0.02) quantised to E4M3 per 32x32 block
// under the power-of-two scale act_quant would give the block. Uniformly random codes are a sixteenth
// subnormal, which real weights almost never are (the x86 FP8 GEMV decodes those on a slower path).
BlockWeights weight_like_fp8(size_t n, size_t k, Rng& rng) {
  BlockWeights w;
  w.n = n;
  w.k = k;
  std::vector<float> v(n * k);
  for (auto& x : v) x = rng.normal(0.0f, 0.02f);
  const size_t kb = k / 32, nb = (n + 31) / 32;
  w.data.assign(n * k, 0);
  w.scales.assign(nb * kb, 0);
  for (size_t bi = 0; bi < nb; ++bi)
    for (size_t bj = 0; bj < kb; ++bj) {
      float amax = 0.0f;
      for (size_t r = bi * 32; r < std::min(n, bi * 32 + 32); ++r)
        for (size_t c = bj * 32; c < bj * 32 + 32; ++c) amax = std::max(amax, std::fabs(v[r * k + c]));
      const float s = pow2_round_up_scale(amax, 1.0f / kE4M3Max);
      w.scales[bi * kb + bj] = e8m0_from_pow2(s);
      for (size_t r = bi * 32; r < std::min(n, bi * 32 + 32); ++r)
        for (size_t c = bj * 32; c < bj * 32 + 32; ++c) w.data[r * k + c] = f32_to_e4m3(v[r * k + c] / s);
    }
  return w;
}

// Copies of the weight bytes on 2 MiB pages, cycled by --perf so that the working set exceeds the
// caches as a real model's weights do (the model's mapped checkpoint is on such pages too).
struct WeightCopies {
  std::vector<HugePageBytes> data, scales;
  size_t next = 0;
  void make(const BlockWeights& w, int copies) {
    for (int c = 1; c < copies; ++c) {
      data.push_back(allocate_huge_page_bytes(w.data.size()));
      scales.push_back(allocate_huge_page_bytes(w.scales.size()));
      std::memcpy(data.back().get(), w.data.data(), w.data.size());
      std::memcpy(scales.back().get(), w.scales.data(), w.scales.size());
    }
  }
  // The copy to read this call: the original first, then each copy in turn.
  std::pair<const uint8_t*, const uint8_t*> pick(const BlockWeights& w) {
    const size_t c = next;
    next = (next + 1) % (data.size() + 1);
    if (c == 0) return {w.data.data(), w.scales.data()};
    return {data[c - 1].get(), scales[c - 1].get()};
  }
};

// y = x · Wᵀ with block-scaled weights: ks.linear_fp8 / linear_fp4 of the mode.
class BlockLinear : public PreparedCase {
 public:
  BlockLinear(bool fp4, const LinearShape& s, const std::string& name, const PrepareOptions& opt) : fp4_(fp4), s_(s) {
    Rng rng(seed_of(name.c_str()));
    x_ = random_bf16(s.m * s.k, rng, 3.0f);
    w_ = fp4          ? random_fp4_weights(s.n, s.k, rng)
         : s.released ? weight_like_fp8(s.n, s.k, rng)
                      : random_fp8_weights(s.n, s.k, rng);
    scratch_.resize(std::max(kernel_set(Numerics::kExact).act_scratch_floats(s.m, s.k),
                             kernel_set(Numerics::kFast).act_scratch_floats(s.m, s.k)));
    out = GuardedFloats(s.m * s.n);
    copies_.make(w_, opt.copies);
    if (!opt.reference) return;
    std::vector<float> ref_scratch(fp8_act_scratch_floats(s.m, s.k));
    const PreparedActivations prepared = quantize_activations(x_.data(), s.m, s.k, ref_scratch);
    const ActivationLayout& a = ActivationAccess::layout(prepared);
    want.resize(s.m * s.n);
    if (fp4) {
      ref::gemm_fp4(prepared, w_.fp4w(), want.data());
    } else {
      ref::gemm_fp8(prepared, w_.fp8(), want.data());
    }
    // Σ|a·w| per output from the quantised activations and the exact weights. Additions on a
    // product's path: fast <= k (sequential worst case), exact = k/32 + 1 (the fp32 block
    // accumulation after exact block sums).
    const double depth = static_cast<double>(s.k) + static_cast<double>(s.k / 32) + 1.0;
    std::vector<double> row(s.k);
    fast_bound.assign(s.m * s.n, 0.0);
    for (size_t j = 0; j < s.n; ++j) {
      for (size_t c = 0; c < s.k; ++c) row[c] = std::fabs(w_.value(j, c));
      for (size_t i = 0; i < s.m; ++i) {
        double abs_sum = 0;
        for (size_t c = 0; c < s.k; ++c)
          abs_sum += std::fabs(static_cast<double>(a.values[i * s.k + c]) * a.scales[i * (s.k / 32) + c / 32]) * row[c];
        fast_bound[i * s.n + j] = 1.01 * depth * kU32 * abs_sum + 1e-30;
      }
    }
    fast_rel = 1.01 * kUBf16;  // one rounding of each side to bf16
  }
  void run(const KernelSet& ks, ThreadPool* pool) override {
    const auto [data, scales] = copies_.pick(w_);
    if (fp4_) {
      // Not in the kernel set (the model runs FP4 weights through gemm_fp4_batch): by name.
      (ks.numerics == Numerics::kFast ? fast::linear_fp4 : linear_fp4)(
          x_.data(), s_.m, Fp4Weight{data, scales, s_.n, s_.k}, out.data(), scratch_, pool);
    } else {
      ks.linear_fp8(x_.data(), s_.m, Fp8Weight{data, scales, s_.n, s_.k}, out.data(), scratch_, pool);
    }
  }

 private:
  bool fp4_;
  LinearShape s_;
  std::vector<float> x_, scratch_;
  BlockWeights w_;
  WeightCopies copies_;
};

// The dense linears: ks.linear_bf16 (plain or on the coded form), linear_f32 and linear_fp8_bf16 of the mode
// (the FP8 weight decoded to bf16 rows; its reference is ref::linear_bf16 of the dequantised weight).
enum class Dense { kBf16, kBf16Coded, kF32, kFp8AsBf16 };

class DenseLinear : public PreparedCase {
 public:
  DenseLinear(Dense kind, LinearOut out_kind, const LinearShape& s, const std::string& name, const PrepareOptions& opt)
      : kind_(kind), out_kind_(out_kind), s_(s) {
    Rng rng(seed_of(name.c_str()));
    x_ = random_bf16(s.m * s.k, rng, 2.0f);
    std::vector<float> wf;  // the weight's values
    if (kind == Dense::kFp8AsBf16) {
      w8_ = weight_like_fp8(s.n, s.k, rng);
      bits_.resize(s.n * s.k);
      dequantize_fp8_weight_to_bf16(w8_.fp8(), bits_.data());
      for (uint16_t b : bits_) wf.push_back(bf16_bits_to_f32(b));
    } else if (kind == Dense::kF32) {
      wf.resize(s.n * s.k);
      for (auto& v : wf) v = rng.normal(0.0f, 0.05f);  // genuine f32 weights: products need more than 24 bits
      f32_ = wf;
    } else {
      wf = random_bf16(s.n * s.k, rng, 0.05f);
      bits_.resize(wf.size());
      for (size_t i = 0; i < wf.size(); ++i) bits_[i] = f32_to_bf16_bits(wf[i]);
      if (kind == Dense::kBf16Coded) coded_ = code_bf16(Bf16Weight{bits_.data(), s.n, s.k});
    }
    out = GuardedFloats(s.m * s.n);
    if (!opt.reference) return;
    want.resize(s.m * s.n);
    if (kind == Dense::kF32) {
      ref::linear_f32(x_.data(), s.m, F32Weight{f32_.data(), s.n, s.k}, want.data());
    } else {
      ref::linear_bf16(x_.data(), s.m, Bf16Weight{bits_.data(), s.n, s.k}, want.data(), out_kind);
    }
    // The references are the exact dot rounded once; fast sums at most k terms in fp32.
    fast_bound.assign(s.m * s.n, 0.0);
    for (size_t i = 0; i < s.m; ++i)
      for (size_t j = 0; j < s.n; ++j) {
        double abs_sum = 0;
        for (size_t c = 0; c < s.k; ++c) abs_sum += std::fabs(static_cast<double>(x_[i * s.k + c]) * wf[j * s.k + c]);
        fast_bound[i * s.n + j] = 1.01 * (s.k + 1.0) * kU32 * abs_sum + 1e-30;
      }
    if (out_kind == LinearOut::kBf16) fast_rel = 1.01 * kUBf16;  // one rounding of each side to bf16
  }
  void run(const KernelSet& ks, ThreadPool* pool) override {
    const bool is_fast = ks.numerics == Numerics::kFast;
    switch (kind_) {
      // Not in the kernel set (no V4.1 weight is f32; wo_a runs through fp8_linear_batch): by name.
      case Dense::kF32:
        return (is_fast ? fast::linear_f32 : linear_f32)(x_.data(), s_.m, F32Weight{f32_.data(), s_.n, s_.k},
                                                         out.data(), pool);
      case Dense::kFp8AsBf16:
        return (is_fast ? fast::linear_fp8_bf16 : linear_fp8_bf16)(x_.data(), s_.m, w8_.fp8(), out.data(), out_kind_,
                                                                   pool);
      default:
        return ks.linear_bf16(x_.data(), s_.m, Bf16Weight{bits_.data(), s_.n, s_.k, coded_.get()}, out.data(),
                              out_kind_, pool);
    }
  }

 private:
  Dense kind_;
  LinearOut out_kind_;
  LinearShape s_;
  std::vector<float> x_, f32_;
  std::vector<uint16_t> bits_;
  BlockWeights w8_;
  std::unique_ptr<Bf16Coded> coded_;
};

// The activation quantiser of the block linears (ks.quantize_activations): each block of 32 to E4M3
// codes under a power-of-two scale (act_quant). The output is the dequantised values q·s (exact in
// f32; the fast set stores them so, the exact set stores q) then the scales s; both sets must equal
// act_quant_fp8's codes and E8M0 scales, decoded, bit for bit.
class QuantizeActivations : public PreparedCase {
 public:
  QuantizeActivations(size_t m, size_t k, const std::string& name, const PrepareOptions& opt) : m_(m), k_(k) {
    Rng rng(seed_of(name.c_str()));
    x_ = random_bf16(m * k, rng, 3.0f);
    for (size_t i = 0; i < x_.size(); i += 7) x_[i] = round_bf16(x_[i] * 0x1p-12f);  // wide in-block spans
    scratch_.resize(std::max(kernel_set(Numerics::kExact).act_scratch_floats(m, k),
                             kernel_set(Numerics::kFast).act_scratch_floats(m, k)));
    out = GuardedFloats(m * k + m * k / 32);
    if (!opt.reference) return;
    std::vector<uint8_t> codes(m * k), scales(m * k / 32);
    act_quant_fp8(x_.data(), m * k, codes.data(), scales.data());
    want.resize(out.size());
    for (size_t i = 0; i < m * k; ++i) want[i] = e4m3_to_f32(codes[i]) * e8m0_to_f32(scales[i / 32]);
    for (size_t b = 0; b < m * k / 32; ++b) want[m * k + b] = e8m0_to_f32(scales[b]);
  }
  void run(const KernelSet& ks, ThreadPool*) override {
    const ActivationLayout a = ActivationAccess::layout(ks.quantize_activations(x_.data(), m_, k_, scratch_));
    for (size_t i = 0; i < m_ * k_; ++i) out.data()[i] = a.dequantized ? a.values[i] : a.values[i] * a.scales[i / 32];
    for (size_t b = 0; b < m_ * k_ / 32; ++b) out.data()[m_ * k_ + b] = a.scales[b];
  }

 private:
  size_t m_, k_;
  std::vector<float> x_, scratch_;
};

double block_bytes(bool fp4, const LinearShape& s) {
  const double w =
      fp4 ? s.n * s.k / 2.0 + s.n * (s.k / 32.0) : s.n * static_cast<double>(s.k) + ((s.n + 31) / 32) * (s.k / 32.0);
  return w + 4.0 * s.m * s.k + 4.0 * s.m * s.n;
}

}  // namespace

void add_linear_cases(std::vector<OpCase>& cases) {
  const std::vector<Numerics> both = {Numerics::kExact, Numerics::kFast};
  // Small shapes first (those of linear_fast_test.cc): m < 6 the GEMV (1, 4 and 4 + 1 rows); m >= 6 the
  // panel GEMM with partial row tiles, partial 16-column panels, column groups of 1-4 panels and K not
  // a multiple of the 256-wide panel; on AMX whole 16-row tiles alone (16, 64), with rows past the
  // last one (35, 40) and only those (6-13). Then the released V4.1 shapes (dim 5120).
  std::vector<LinearShape> small = {{1, 96, 37},   {1, 1024, 100}, {2, 160, 33}, {4, 64, 20},
                                    {5, 320, 70},  {6, 256, 16},   {7, 288, 50}, {13, 544, 33},
                                    {16, 256, 20}, {35, 800, 90},  {40, 96, 70}, {64, 1056, 48}};
  std::vector<LinearShape> fp8 = small, fp4 = small;
  for (LinearShape s : std::initializer_list<LinearShape>{
           {1, 5120, 1280, true},         // wq_a
           {1, 5120, 512, true},          // wkv
           {1, 1280, 4096, true},         // the indexer's wq_b (32 heads of 128)
           {1, 5120, 2304, true},         // the shared expert's w1, w3
           {1, 2304, 5120, true, true},   // the shared expert's w2
           {1, 1280, 32768, true, true},  // wq_b (64 heads of 512)
           {1, 8192, 5120, true, true},   // wo_b
           {64, 5120, 2304, true, true},  // a 64-token prefill chunk through the shared expert
       })
    fp8.push_back(s);
  for (LinearShape s : std::initializer_list<LinearShape>{
           {1, 5120, 2304, true},         // a routed expert's w1, w3
           {1, 2304, 5120, true, true},   // its w2
           {4, 5120, 2304, true, true},   // 4 decode rows (speculation) through one expert
           {8, 5120, 2304, true, true},   // a 512-token chunk over 384 experts, top 6: ~8 rows each
           {64, 5120, 2304, true, true},  // a prefill chunk through one expert
       })
    fp4.push_back(s);
  for (bool is_fp4 : {false, true}) {
    const char* op = is_fp4 ? "linear_fp4" : "linear_fp8";
    for (const LinearShape& s : is_fp4 ? fp4 : fp8) {
      add_case<BlockLinear>(
          cases,
          {.name = shape_name(op, s),
           .op = op,
           .numerics = both,
           .reach = uint32_t{(is_fp4 ? kReachFp4Gemv : kReachFp8Gemv) | kReachGemmTiles},
           .released = s.released,
           .perf_only = s.perf_only,
           .bound = "exact: bitwise = ref::gemm; fast: 1.01*((k+k/32+1)*2^-24*sum|a*w| + 2^-8*(|got|+|want|))",
           .bytes = block_bytes(is_fp4, s),
           .flops = 2.0 * s.m * s.n * s.k},
          is_fp4, s);
    }
  }
  for (const LinearShape& s : std::initializer_list<LinearShape>{{1, 96, 0},
                                                                 {3, 160, 0},
                                                                 {5, 1024, 0},
                                                                 {17, 288, 0},
                                                                 {1, 5120, 0, true},
                                                                 {4, 5120, 0, true},
                                                                 {64, 5120, 0, true}}) {
    add_case<QuantizeActivations>(
        cases,
        {.name = "quantize_activations m=" + std::to_string(s.m) + " k=" + std::to_string(s.k),
         .op = "quantize_activations",
         .numerics = both,
         .reach = kReachLinear,  // the fast set packs the x86 GEMVs' and tiles' layouts where they apply
         .released = s.released,
         .bound = "bitwise = act_quant_fp8 (E4M3 codes, E8M0 scales) decoded, in both sets",
         .bytes = 4.0 * s.m * s.k * 2,
         .flops = 2.0 * s.m * s.k},
        s.m, s.k);
  }
  // Dense: k not a multiple of any vector width too (linear_fast_dense_test.cc's shapes), and GEMMs
  // with k a multiple of 32 that take the AVX512-BF16 and AMX tiles.
  const std::vector<LinearShape> dense_small = {{1, 7, 37},    {1, 1000, 65}, {3, 64, 20},   {5, 129, 33},
                                                {6, 33, 16},   {17, 300, 70}, {40, 520, 19}, {7, 96, 33},
                                                {13, 544, 40}, {33, 544, 140}};
  struct DenseOp {
    const char* op;
    Dense kind;
    LinearOut out;
    std::vector<LinearShape> shapes;
  };
  const std::vector<DenseOp> dense = {
      {"linear_bf16 out=f32", Dense::kBf16, LinearOut::kF32,
       [&] {
         auto v = dense_small;
         v.push_back({1, 5120, 384, true});          // the router gate
         v.push_back({1, 5120, 16384, true, true});  // a slice of the head, not coded
         return v;
       }()},
      {"linear_bf16 out=bf16", Dense::kBf16, LinearOut::kBf16, dense_small},
      {"linear_bf16_coded out=f32",
       Dense::kBf16Coded,
       LinearOut::kF32,
       {{1, 640, 150}, {3, 192, 70}, {5, 5120, 40}, {1, 5120, 300, true}, {1, 5120, 16384, true, true}}},  // the head
      {"linear_f32", Dense::kF32, LinearOut::kF32, dense_small},
      {"linear_fp8_bf16",
       Dense::kFp8AsBf16,
       LinearOut::kBf16,
       {{1, 96, 37}, {3, 256, 33}, {17, 320, 70}, {1, 4096, 1024, true}, {64, 4096, 1024, true, true}}},  // wo_a
  };
  for (const DenseOp& d : dense) {
    for (const LinearShape& s : d.shapes) {
      // Bytes per weight: the coded head reads about 1.5 (bf16_coded.h), the FP8 weight 1 (+ scales).
      const double wbytes = d.kind == Dense::kF32         ? 4.0
                            : d.kind == Dense::kFp8AsBf16 ? 1.0
                            : d.kind == Dense::kBf16Coded ? 1.5
                                                          : 2.0;
      add_case<DenseLinear>(
          cases,
          {.name = shape_name(d.op, s),
           .op = std::string(d.op).substr(0, std::string(d.op).find(' ')),
           .numerics = both,
           .reach = d.kind == Dense::kFp8AsBf16 ? uint32_t{kReachFp8Gemv | kReachGemmTiles} : uint32_t{kReachGemmTiles},
           .released = s.released,
           .perf_only = s.perf_only,
           .bound = d.out == LinearOut::kBf16
                        ? "exact: bitwise = ref::linear_bf16; fast: 1.01*(k+1)*2^-24*sum|x*w| + 2^-8*(|got|+|want|)"
                        : "exact: bitwise = ref::linear; fast: 1.01*(k+1)*2^-24*sum|x*w|",
           .bytes = wbytes * s.n * s.k + 4.0 * s.m * s.k + 4.0 * s.m * s.n,
           .flops = 2.0 * s.m * s.n * s.k},
          d.kind, d.out, s);
    }
  }
}

}  // namespace cedar::ops::testing
