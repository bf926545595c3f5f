// ViT + aligner speed at the released vision widths (1024 wide, 16 heads, SwiGLU 2816, 14x14
// patches) on the patch grid of a 4000x3000 photo under the release's processor (81 x 108 = 8,748
// patches, 27 x 36 tokens: 1,001 image tokens, the size the 1,024-token budget allows). The tower has
// CEDAR_VISION_BENCH_LAYERS blocks (default 2; the release has 32: the blocks are identical, so the
// time scales with their count); the aligner maps into the tiny preset's width (64), a negligible
// part of the released cost (9216x5120 + 5120x5120 per token). Reports GFLOP/s of the tower's matmuls
// and attention (2 x MACs); compare with `cedar bench`'s "fast bf16 GEMM peak" for the same threads.
// Run: build/bench/cedar_bench --benchmark_filter=Vision
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "spec/config.h"
#include "tiny/tiny_checkpoint.h"
#include "model/vision_aligner.h"
#include "model/vision_tower.h"
#include "spec/weight_inventory.h"
#include "weights/weight_map.h"
#include "ops/formats/formats.h"

namespace cedar::model {
namespace {

constexpr int kGridH = 81, kGridW = 108;

int bench_layers() {
  const char* v = std::getenv("CEDAR_VISION_BENCH_LAYERS");
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 2;
}

struct VisionBenchModel {
  io::Checkpoint checkpoint;
  std::unique_ptr<WeightMap> map;
  ModelConfig config;
  std::unique_ptr<VisionTower> tower;
  std::unique_ptr<VisionAligner> aligner;
};

VisionBenchModel* bench_model() {
  static std::unique_ptr<VisionBenchModel> model = [] {
    auto m = std::make_unique<VisionBenchModel>();
    ModelConfig c = tiny_config(TinyPreset::kTiny);
    c.engram_compressed_vocab_size = 1000;  // no tokenizer ships: only the vision tensors are read
    c.vision = tiny_vision_config();
    c.vision.n_layers = bench_layers();
    c.vision.dim = 1024;
    c.vision.n_heads = 16;
    c.vision.inter_dim = 2816;
    const std::string dir = std::filesystem::temp_directory_path().string() + "/cedar_vision_bench_" +
                            std::to_string(c.vision.n_layers) + "_" + std::to_string(::getpid());
    TinyOptions opt;
    opt.out_dir = dir;
    opt.seed = 7;
    if (Status st = write_tiny_checkpoint(c, opt); !st.ok()) throw std::runtime_error(st.to_string());
    auto ckpt = io::Checkpoint::open(dir);
    if (!ckpt.ok()) throw std::runtime_error(ckpt.status().to_string());
    m->checkpoint = std::move(*ckpt);
    auto map = WeightMap::bind(m->checkpoint, weight_inventory(c));
    if (!map.ok()) throw std::runtime_error(map.status().to_string());
    m->map = std::make_unique<WeightMap>(std::move(*map));
    m->config = c;
    auto tower = VisionTower::bind(c, *m->map);
    auto aligner = VisionAligner::bind(c, *m->map);
    if (!tower.ok() || !aligner.ok()) throw std::runtime_error("vision bench: cannot bind the tower");
    m->tower = std::move(tower).value();
    m->aligner = std::move(aligner).value();
    std::filesystem::remove_all(dir);  // the mapping keeps the bytes alive
    return m;
  }();
  return model.get();
}

void BM_VisionTower(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const ops::Numerics numerics = state.range(1) ? ops::Numerics::kFast : ops::Numerics::kExact;
  VisionBenchModel* m = bench_model();
  const VisionConfig& v = m->config.vision;
  const size_t n = static_cast<size_t>(kGridH) * kGridW, d = v.dim, inter = v.inter_dim, p = 3 * 14 * 14;
  std::mt19937 rng(3);
  std::vector<uint16_t> patches(n * p);
  for (auto& b : patches) b = ops::f32_to_bf16_bits(static_cast<float>(rng() % 256) / 127.5f - 1.0f);
  ThreadPool pool(threads);
  const ops::KernelSet& ks = ops::kernel_set(numerics);
  for (auto _ : state) {
    std::vector<float> x = m->tower->forward(patches, kGridH, kGridW, ks, &pool);
    std::vector<float> y = m->aligner->forward(x, kGridH, kGridW, ks, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  const double per_block = 2.0 * n * (d * 3 * d + d * d + d * 2 * inter + inter * d) + 2.0 * 2.0 * n * n * d;
  const double flops = 2.0 * n * p * d + v.n_layers * per_block;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["blocks"] = v.n_layers;
  state.counters["patches"] = static_cast<double>(n);
}

BENCHMARK(BM_VisionTower)
    ->ArgNames({"threads", "fast"})
    ->Args({1, 1})
    ->Args({2, 1})
    ->Iterations(1)
    ->Unit(benchmark::kSecond)
    ->UseRealTime();

}  // namespace
}  // namespace cedar::model
