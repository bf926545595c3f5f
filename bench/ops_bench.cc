// Microbenchmarks of the ops hot kernels. GEMV cases report bytes/s of weight bytes read (codes +
// scales), cycling through several weight copies so the working set exceeds the last-level cache, as
// it does for a real model. Weights sit on 2 MiB pages, as the model's mapped checkpoint does;
// CEDAR_BENCH_SMALL_PAGES=1 gives them 4 KiB pages instead, to measure what the page size is worth.
// Run: build/bench/cedar_bench --benchmark_filter=Ops
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "core/huge_pages.h"
#include "core/thread_pool.h"
#include "ops/attention.h"
#include "ops/bf16_coded.h"
#include "ops/formats.h"
#include "ops/indexer_tiles_x86.h"
#include "ops/kernel_set.h"
#include "ops/linear.h"
#include "ops/quant.h"

namespace cedar::ops {
namespace {

// Distinct weight matrices cycled per iteration: 8 defeat the caches (as a real model's weights
// do); 1 keeps a matrix that fits the last-level cache hot, as ggml's test-backend-ops measures.
constexpr size_t kCopies = 8;

// Weight storage on 2 MiB pages, as the model's mapped checkpoint is (io::MappedFile aligns large
// mappings for them and advises MADV_HUGEPAGE); the default allocator would give a 168 MB matrix 4 KiB
// pages (this machine's transparent huge pages are madvise-only) and a TLB miss every 4 KiB of the
// stream.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(size_t n) {
    HugePageBytes p = allocate_huge_page_bytes(n * sizeof(T), std::getenv("CEDAR_BENCH_SMALL_PAGES") == nullptr);
    if (p == nullptr) throw std::bad_alloc();
    return reinterpret_cast<T*>(p.release());
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const { return true; }
};
template <class T>
using WeightVector = std::vector<T, HugePageAllocator<T>>;

WeightVector<uint8_t> random_bytes(size_t n, uint32_t seed, uint8_t mask = 0xFF) {
  std::mt19937 rng(seed);
  WeightVector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng() & mask);
  return v;
}

// An FP8 weight as a checkpoint holds one: normal values quantised to E4M3 per 32x32 block under a
// power-of-two E8M0 scale that maps the block's largest magnitude to at most 448. Uniformly random
// codes would be a weight no training produces: a sixteenth of them subnormal (exponent field 0),
// where real blocks have almost none, and the FP8 GEMV decodes those through a slower path.
void weight_like_fp8(size_t n, size_t k, uint32_t seed, WeightVector<uint8_t>& codes, WeightVector<uint8_t>& scales) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> v(n * k);
  for (auto& x : v) x = normal(rng);
  const size_t kb = k / 32;
  codes.assign(n * k, 0);
  scales.assign(((n + 31) / 32) * kb, 0);
  for (size_t bi = 0; bi < (n + 31) / 32; ++bi)
    for (size_t bj = 0; bj < kb; ++bj) {
      float amax = 0.0f;
      for (size_t r = bi * 32; r < std::min(n, bi * 32 + 32); ++r)
        for (size_t c = bj * 32; c < bj * 32 + 32; ++c) amax = std::max(amax, std::fabs(v[r * k + c]));
      const float s = pow2_round_up_scale(amax, 1.0f / kE4M3Max);  // as act_quant_fp8 scales a block
      scales[bi * kb + bj] = e8m0_from_pow2(s);
      for (size_t r = bi * 32; r < std::min(n, bi * 32 + 32); ++r)
        for (size_t c = bj * 32; c < bj * 32 + 32; ++c) codes[r * k + c] = f32_to_e4m3(v[r * k + c] / s);
    }
}

std::vector<float> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = round_bf16(normal(rng));
  return v;
}

ThreadPool* pool_for(int threads) {
  static ThreadPool one(1), two(2), all(hardware_threads());
  if (threads == 1) return &one;
  if (threads == 2) return &two;
  return &all;
}

// Args: n, k, m, threads (0 = all hardware threads), numerics, weight copies.
void BM_OpsLinearFp8(benchmark::State& state) {
  const size_t n = state.range(0), k = state.range(1), m = state.range(2), copies = state.range(5);
  ThreadPool* pool = pool_for(static_cast<int>(state.range(3)));
  std::vector<WeightVector<uint8_t>> codes, scales;
  for (size_t c = 0; c < copies; ++c) {
    codes.emplace_back();
    scales.emplace_back();
    weight_like_fp8(n, k, static_cast<uint32_t>(1 + c), codes.back(), scales.back());
  }
  const KernelSet& ks = kernel_set(state.range(4) ? Numerics::kFast : Numerics::kExact);
  const auto x = random_bf16(m * k, 9);
  std::vector<float> y(m * n), scratch(ks.act_scratch_floats(m, k));
  size_t c = 0;
  for (auto _ : state) {
    ks.linear_fp8(x.data(), m, Fp8Weight{codes[c].data(), scales[c].data(), n, k}, y.data(), scratch, pool);
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % copies;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * (codes[0].size() + scales[0].size())));
}
// Args: n, k, m, threads, numerics (0 exact, 1 fast), copies. The issue-13 GEMV shapes with 1 and 2
// threads (cold: 8 copies; hot: 1 copy, as ggml's test-backend-ops measures), and prefill-sized GEMMs.
void LinearArgs(benchmark::internal::Benchmark* b, std::initializer_list<std::pair<int64_t, int64_t>> gemv) {
  for (int64_t mode : {0, 1}) {
    for (const auto& [n, k] : gemv)
      for (int64_t t : {1, 2}) {
        b->Args({n, k, 1, t, mode, kCopies});
        b->Args({n, k, 1, t, mode, 1});
      }
    b->Args({2304, 5120, 64, 2, mode, kCopies});
    b->Args({2304, 5120, 8, 1, mode, kCopies});  // a 512-token chunk over 384 experts, top-6: ~8 rows each
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}
BENCHMARK(BM_OpsLinearFp8)->Apply([](auto* b) { LinearArgs(b, {{2304, 5120}, {32768, 1280}}); });

void BM_OpsLinearFp4(benchmark::State& state) {
  const size_t n = state.range(0), k = state.range(1), m = state.range(2), copies = state.range(5);
  ThreadPool* pool = pool_for(static_cast<int>(state.range(3)));
  std::vector<WeightVector<uint8_t>> packed, scales;
  for (size_t c = 0; c < copies; ++c) {
    packed.push_back(random_bytes(n * k / 2, 20 + c));
    scales.push_back(WeightVector<uint8_t>(n * (k / 32), 120));
  }
  const KernelSet& ks = kernel_set(state.range(4) ? Numerics::kFast : Numerics::kExact);
  const auto x = random_bf16(m * k, 9);
  std::vector<float> y(m * n), scratch(ks.act_scratch_floats(m, k));
  size_t c = 0;
  for (auto _ : state) {
    ks.linear_fp4(x.data(), m, Fp4Weight{packed[c].data(), scales[c].data(), n, k}, y.data(), scratch, pool);
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % copies;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * (packed[0].size() + scales[0].size())));
}
// Also 256 x 5120 fast with 1 thread, 0.7 MB: it stays in a 1 MB L2, so this row is the kernel's compute
// ceiling (the activation quantiser included) rather than the memory's.
BENCHMARK(BM_OpsLinearFp4)->Apply([](auto* b) {
  LinearArgs(b, {{2304, 5120}, {32768, 5120}});
  b->Args({256, 5120, 1, 1, 1, 1});
});

// Args: m, k. The fast activation quantiser as a decode step runs it before every GEMV batch (FP8
// codes, block scales and, for m < 6, the FP4 GEMV's layout), on the calling thread.
void BM_OpsQuantizeActivations(benchmark::State& state) {
  const size_t m = state.range(0), k = state.range(1);
  const KernelSet& ks = kernel_set(Numerics::kFast);
  const auto x = random_bf16(m * k, 5);
  std::vector<float> scratch(ks.act_scratch_floats(m, k));
  for (auto _ : state) {
    const Fp8Activations a = ks.quantize_activations(x.data(), m, k, scratch);
    benchmark::DoNotOptimize(a.values);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * m * k));
}
BENCHMARK(BM_OpsQuantizeActivations)->Args({1, 1024})->Args({1, 5120})->Args({4, 5120})->Unit(benchmark::kMicrosecond);

void BM_OpsLinearBf16(benchmark::State& state) {
  const size_t n = state.range(0), k = state.range(1);
  ThreadPool* pool = pool_for(static_cast<int>(state.range(2)));
  std::vector<WeightVector<uint16_t>> w;
  for (size_t c = 0; c < static_cast<size_t>(state.range(4)); ++c) {
    // Weight-like values (normal, sd 0.02): random bit patterns would be mostly tiny or subnormal,
    // which no checkpoint holds and which x86 multiplies only through slow microcode assists.
    const auto values = random_bf16(n * k, 40 + static_cast<uint32_t>(c));
    w.emplace_back(n * k);
    for (size_t i = 0; i < n * k; ++i) w.back()[i] = f32_to_bf16_bits(values[i] * 0.02f);
  }
  const KernelSet& ks = kernel_set(state.range(3) ? Numerics::kFast : Numerics::kExact);
  std::vector<Bf16Weight> weights;
  std::vector<std::unique_ptr<Bf16Coded>> coded;
  for (const auto& copy : w) {
    weights.push_back({copy.data(), n, k});
    if (state.range(5) != 0) {  // as the model codes its bf16 GEMV weights for the fast kernels
      coded.push_back(code_bf16(weights.back()));
      weights.back().coded = coded.back().get();
    }
  }
  const auto x = random_bf16(k, 9);
  std::vector<float> y(n);
  size_t c = 0;
  for (auto _ : state) {
    ks.linear_bf16(x.data(), 1, weights[c], y.data(), LinearOut::kF32, pool);
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % w.size();
  }
  // Bytes of the bf16 matrix, coded or not, so the figures of the two forms compare as times do;
  // read_bytes counts what the coded form actually reads.
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * k * 2));
  state.counters["read_bytes"] = static_cast<double>(coded.empty() ? n * k * 2 : coded[0]->bytes());
}
// Args: n, k, threads, numerics (0 exact, 1 fast), copies (4: 672 MB cycled, as a real model's weights;
// 1: the one 168 MB matrix that ggml's test-backend-ops reuses, larger than L3 but partly kept there),
// coded (1: the fast GEMV on the 12-bit form of ops/bf16_coded.h, as the model runs it; 0: on bf16).
BENCHMARK(BM_OpsLinearBf16)
    ->Args({16384, 5120, 1, 0, 4, 0})
    ->Args({16384, 5120, 2, 0, 4, 0})
    ->Args({16384, 5120, 1, 1, 4, 1})
    ->Args({16384, 5120, 2, 1, 4, 1})
    ->Args({16384, 5120, 1, 1, 1, 1})
    ->Args({16384, 5120, 2, 1, 1, 1})
    ->Args({16384, 5120, 1, 1, 1, 0})
    ->Args({16384, 5120, 2, 1, 1, 0})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_OpsSparseAttn(benchmark::State& state) {
  const size_t n_idx = state.range(0), heads = state.range(1), d = state.range(2);
  const KernelSet& ks = kernel_set(state.range(3) ? Numerics::kFast : Numerics::kExact);
  const auto q = random_bf16(heads * d, 1);
  const auto rows = random_bf16(n_idx * d, 2);
  std::vector<float> sink(heads, 0.0f), out(heads * d);
  std::vector<int32_t> idx(n_idx);
  for (size_t i = 0; i < n_idx; ++i) idx[i] = static_cast<int32_t>(i);
  ThreadPool* pool = pool_for(static_cast<int>(state.range(4)));
  for (auto _ : state) {
    ks.sparse_attn(q.data(), heads, d, KvRows{rows.data(), n_idx, nullptr, 0}, sink.data(), idx.data(), n_idx,
                0.044f, out.data(), pool);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * heads * n_idx));  // head-rows
}
// Args: rows, heads, head_dim (the released model: 512 + 128 rows, 64 heads of 512; small: 128 + 128,
// 16 of 128), numerics (0 exact, 1 fast), threads (0 = all).
BENCHMARK(BM_OpsSparseAttn)
    ->Args({640, 64, 512, 0, 0})
    ->Args({640, 64, 512, 1, 1})
    ->Args({640, 64, 512, 1, 0})
    ->Args({256, 16, 128, 1, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// One query's indexer scores over n_keys FP4 index keys (V4.1: 64 heads of 128), as the model runs
// them. Args: n_keys, path (0: float64 row dots, the contract as written; 1: integer key tiles with
// the exact-spread test, what the forward pass uses: the AVX512-VNNI tile kernel where the CPU has
// it; 2: the tiles on the Highway kernel alone), threads (0 = all).
void BM_OpsIndexerScores(benchmark::State& state) {
  const size_t heads = 64, d = 128, n_keys = state.range(0);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255), scale(124, 130);
  const auto packed_rows = [&](size_t rows, std::vector<uint8_t>* packed, std::vector<uint8_t>* scales) {
    packed->resize(rows * d / 2);
    scales->resize(rows * d / 32);
    for (auto& b : *packed) b = static_cast<uint8_t>(byte(rng));
    for (auto& s : *scales) s = static_cast<uint8_t>(scale(rng));
  };
  std::vector<uint8_t> kp, ks, qp, qs;
  packed_rows(n_keys, &kp, &ks);
  packed_rows(heads, &qp, &qs);
  std::vector<float> keys(n_keys * d), q(heads * d);
  fp4_dequant_e8m0(kp.data(), ks.data(), n_keys * d, keys.data());
  fp4_dequant_e8m0(qp.data(), qs.data(), heads * d, q.data());
  const auto w = random_bf16(heads, 3);
  std::vector<uint8_t> spread(n_keys), codes(index_key_tile_code_bytes(n_keys, d));
  std::vector<double> tile_scales(index_key_tile_scale_count(n_keys, d));
  for (size_t t = 0; t < n_keys; ++t) {
    spread[t] = exact_sum_spread_fp4(kp.data() + t * d / 2, ks.data() + t * d / 32, d);
    append_index_key_tile(kp.data() + t * d / 2, ks.data() + t * d / 32, d, t, codes.data(), tile_scales.data());
  }
  const IndexKeyTiles tiles{codes.data(), tile_scales.data()};
  const bool tiled = state.range(1) >= 1;
  x86::set_indexer_tiles_vnni_allowed(state.range(1) == 1);
  std::vector<float> scores(n_keys);
  ThreadPool* pool = pool_for(static_cast<int>(state.range(2)));
  for (auto _ : state) {
    if (tiled) {
      indexer_scores(q.data(), w.data(), heads, d, keys.data(), n_keys, scores.data(), pool, spread.data(), &tiles);
    } else {
      indexer_scores(q.data(), w.data(), heads, d, keys.data(), n_keys, scores.data(), pool);
    }
    benchmark::DoNotOptimize(scores.data());
  }
  x86::set_indexer_tiles_vnni_allowed(true);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n_keys));
  // Multiply-adds of q·key per second.
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(state.iterations() * n_keys * heads * d) * 1e-9,
                                                benchmark::Counter::kIsRate);
}
BENCHMARK(BM_OpsIndexerScores)
    ->Args({8192, 0, 1})
    ->Args({8192, 1, 1})
    ->Args({8192, 2, 1})
    ->Args({65536, 1, 1})
    ->Args({65536, 2, 1})
    ->Args({65536, 1, 2})
    ->Args({65536, 2, 2})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The indexer's top-k of one query (V4.1: 512 of the visible keys) over bf16 scores as the indexer
// leaves them: relu'd head sums, so many repeat (zeros above all). Args: n_keys, percent of zeros.
void BM_OpsIndexerTopK(benchmark::State& state) {
  const size_t n = state.range(0), k = 512;
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> percent(0, 99);
  std::vector<float> scores(n);
  for (auto& s : scores) s = percent(rng) < state.range(1) ? 0.0f : round_bf16(std::fabs(normal(rng)));
  std::vector<int32_t> out(k), scratch(n);
  for (auto _ : state) {
    topk_ascending(scores.data(), n, k, out.data(), scratch.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
}
BENCHMARK(BM_OpsIndexerTopK)->Args({16384, 0})->Args({16384, 50})->Args({65536, 50})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace cedar::ops
