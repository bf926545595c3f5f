// The bf16 GEMV of bench/compare_ggml.sh's table (16384 x 5120, one token) with ggml and cedar in ONE
// process, alternating call by call on the same values. The matrix (168 MB) is read from DRAM on both
// sides, and this VM's read bandwidth drifts between ~28 and ~60 GB/s within seconds, so two
// separate processes measured minutes apart compare the drift more than the kernels; here each
// round's ratio is taken over back-to-back calls. Built by compare_ggml.sh against its ggml build;
// not part of cedar's build (cedar never links ggml).
//
// cedar runs the GEMV as its model runs the head in fast numerics: on the 12-bit coded form of the
// weights (ops/linear/bf16_coded.h); it also runs its kernel on the plain bf16 bits, the same bytes as ggml.
//
// usage: ggml_bf16_side_by_side THREADS [ROUNDS]
// prints: threads, ggml us, cedar us (medians per call), median of the per-round time ratios ggml/cedar,
// then cedar's plain-bf16 us and its median ratio
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core/huge_pages.h"
#include "core/thread_pool.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "ops/linear/bf16_coded.h"
#include "ops/formats/formats.h"
#include "ops/kernel_set.h"
#include "ops/linear/linear.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s THREADS [ROUNDS]\n", argv[0]);
    return 2;
  }
  const int threads = std::atoi(argv[1]);
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 30;
  constexpr int64_t kRows = 16384, kCols = 5120;
  constexpr int kCalls = 10;  // GEMVs per timed sample on each side (ggml: one graph of 10 nodes)

  // ggml's side as test-backend-ops sets it up: weights in a ggml buffer, f32 activations.
  ggml_init_params params{static_cast<size_t>(kRows * kCols * 2) + (size_t{64} << 20), nullptr, false};
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* w = ggml_new_tensor_2d(ctx, GGML_TYPE_BF16, kCols, kRows);
  ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, kCols, 1);
  ggml_tensor* y = ggml_mul_mat(ctx, w, x);
  ggml_cgraph* graph = ggml_new_graph(ctx);
  ggml_build_forward_expand(graph, y);
  for (int i = 1; i < kCalls; ++i) ggml_graph_add_node(graph, y);

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto* w_bits = static_cast<uint16_t*>(w->data);
  for (int64_t i = 0; i < kRows * kCols; ++i) w_bits[i] = cedar::ops::f32_to_bf16_bits(normal(rng) * 0.02f);
  auto* x_values = static_cast<float*>(x->data);
  for (int64_t i = 0; i < kCols; ++i) x_values[i] = cedar::ops::round_bf16(normal(rng));

  // cedar's side as its model runs it: the weights re-coded on 2 MiB pages (Model::set_numerics does
  // this for the head), the fast kernel set, cedar's thread pool; and the plain bits on 2 MiB pages, as
  // io::MappedFile maps the checkpoint.
  cedar::HugePageBytes cedar_bytes = cedar::allocate_huge_page_bytes(kRows * kCols * 2);
  if (cedar_bytes == nullptr) return 1;
  auto* cedar_bits = reinterpret_cast<uint16_t*>(cedar_bytes.get());
  std::memcpy(cedar_bits, w_bits, kRows * kCols * 2);
  cedar::ThreadPool pool(threads);
  const cedar::ops::KernelSet& ks = cedar::ops::kernel_set(cedar::ops::Numerics::kFast);
  const cedar::ops::Bf16Weight plain{cedar_bits, static_cast<size_t>(kRows), static_cast<size_t>(kCols)};
  const auto coded = cedar::ops::code_bf16(plain);
  if (coded == nullptr) return 1;
  cedar::ops::Bf16Weight weight = plain;
  weight.coded = coded.get();
  std::vector<float> cedar_y(kRows), plain_y(kRows);

  using clock = std::chrono::steady_clock;
  std::vector<double> ggml_us, cedar_us, plain_us, ratio, plain_ratio;
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms every side up and is not counted
    const auto t0 = clock::now();
    ggml_graph_compute_with_ctx(ctx, graph, threads);
    const auto t1 = clock::now();
    for (int c = 0; c < kCalls; ++c)
      ks.linear_bf16(x_values, 1, weight, cedar_y.data(), cedar::ops::LinearOut::kF32, &pool);
    const auto t2 = clock::now();
    for (int c = 0; c < kCalls; ++c)
      ks.linear_bf16(x_values, 1, plain, plain_y.data(), cedar::ops::LinearOut::kF32, &pool);
    const auto t3 = clock::now();
    if (r == 0) continue;
    ggml_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / kCalls);
    cedar_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count() / kCalls);
    plain_us.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count() / kCalls);
    ratio.push_back(ggml_us.back() / cedar_us.back());
    plain_ratio.push_back(ggml_us.back() / plain_us.back());
  }
  // Every side must have computed the same thing (fp32 sums in different orders).
  const auto* ggml_y = static_cast<const float*>(y->data);
  for (int64_t i = 0; i < kRows; ++i) {
    for (const float got : {cedar_y[i], plain_y[i]}) {
      if (std::fabs(ggml_y[i] - got) > 1e-3f * (1.0f + std::fabs(ggml_y[i]))) {
        std::fprintf(stderr, "row %lld differs: ggml %g, cedar %g\n", static_cast<long long>(i), ggml_y[i], got);
        return 1;
      }
    }
  }
  std::printf("%d %.1f %.1f %.3f %.1f %.3f\n", threads, median(ggml_us), median(cedar_us), median(ratio),
              median(plain_us), median(plain_ratio));
  ggml_free(ctx);
  return 0;
}
