// KV-cache benchmarks: per-step structural cost of the cache, prefix reuse from memory and from disk,
// block-file writes (fsync'd), and whether zstd is worth it on realistic packed V4.1 blocks.
// Blocks are filled with real packed entries (ops::pack_*) of gaussian latents, so the byte statistics
// (FP4 codes, E4M3/E8M0 scales) are those of a live cache, not of zeros.
#include <benchmark/benchmark.h>
#include <unistd.h>
#include <zstd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kv/block_file.h"
#include "kv/disk_cache.h"
#include "kv/kv_cache.h"
#include "ops/formats/formats.h"
#include "ops/formats/quant.h"

namespace cedar::kv {
namespace {

// DeepSeek-V4.1-Flash as the cache sees it (spec §4.5).
CacheGeometry v41_geometry() {
  ModelKvSpec s;
  s.name = "deepseek-v4.1-flash";
  s.engram_history = 3;
  s.model_fingerprint = 41;
  int source = -1;
  for (int l = 0; l < 43; ++l) {
    LayerKvSpec e;
    e.layer = l;
    e.compress_ratio = l < 2 || l >= 40 ? 0 : (l < 20 ? 2 : 1);
    if (e.compress_ratio > 0) {
      const bool is_source = l == 2 || l == 8 || l == 14 || l == 20;
      if (is_source) source = l;
      e.owns_compressed_kv = e.owns_index_keys = is_source;
      e.kv_from = source;
    }
    s.layers.push_back(e);
  }
  return make_cache_geometry(s, kDefaultBlockTokens, 40).value();
}

// Fills every entry of a sequence's tokens [from, n) with packed entries of N(0, 1) latents.
void fill_entries(Sequence& s, int64_t from, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> latent(ops::kMainKvDim);  // [512] one compressed latent
  std::vector<float> key(ops::kIndexKeyDim);    // [128] one index key
  const CacheGeometry& g = s.geometry();
  for (size_t o = 0; o < g.owners.size(); ++o) {
    const int r = g.owners[o].ratio;
    for (int64_t j = from / r; j < s.n_tokens() / r; ++j) {
      for (float& x : latent) x = ops::round_bf16(normal(rng));
      for (float& x : key) x = ops::round_bf16(normal(rng));
      ops::pack_main_kv_entry(latent.data(), s.main_entry_mut(static_cast<int>(o), j));
      ops::pack_index_key_entry(key.data(), s.index_key_mut(static_cast<int>(o), j));
    }
  }
}

std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 129280);
  return t;
}

std::string bench_dir(const char* name) {
  const std::string d = std::filesystem::temp_directory_path().string() + "/cedar_kv_bench_" + name + "_" +
                        std::to_string(::getpid());
  std::filesystem::remove_all(d);
  return d;
}

// zstd on one realistic 256-token block (227,840 B): compression ratio and speed per level.
void BM_KvZstdBlock(benchmark::State& state) {
  const CacheGeometry g = v41_geometry();
  KvCacheOptions o;
  o.capacity_blocks = 1;
  auto cache = KvCache::create(g, o).value();
  Sequence* s = cache->new_sequence().value();
  std::mt19937 rng(1);
  (void)cache->append(*s, random_tokens(rng, g.block_tokens));
  fill_entries(*s, 0, rng);
  const uint8_t* block = cache->pool().block_data(s->block_table()[0]);
  std::vector<uint8_t> out(ZSTD_compressBound(g.block_bytes));
  size_t n = 0;
  for (auto _ : state) {
    n = ZSTD_compress(out.data(), out.size(), block, g.block_bytes, static_cast<int>(state.range(0)));
    benchmark::DoNotOptimize(n);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g.block_bytes));
  state.counters["ratio"] = static_cast<double>(n) / static_cast<double>(g.block_bytes);
}
BENCHMARK(BM_KvZstdBlock)->Arg(1)->Arg(3)->Arg(9)->Unit(benchmark::kMicrosecond);

// One decode step's cache work: append a token (a new block every 256), write its ratio-1 entry.
void BM_KvAppendDecodeToken(benchmark::State& state) {
  const CacheGeometry g = v41_geometry();
  KvCacheOptions o;
  o.capacity_blocks = 64;
  auto cache = KvCache::create(g, o).value();
  Sequence* s = cache->new_sequence().value();
  const int32_t token = 7;
  for (auto _ : state) {
    if (s->n_tokens() == 64 * 256) (void)cache->truncate(*s, 0);
    (void)cache->append(*s, std::span(&token, 1));
    benchmark::DoNotOptimize(s->main_entry_mut(3, s->n_tokens() - 1));
  }
}
BENCHMARK(BM_KvAppendDecodeToken);

// Reusing a cached 4,096-token prefix from the in-memory index (hashing + token comparison).
void BM_KvAttachPrefixMemory(benchmark::State& state) {
  const CacheGeometry g = v41_geometry();
  KvCacheOptions o;
  o.capacity_blocks = 64;
  auto cache = KvCache::create(g, o).value();
  std::mt19937 rng(2);
  const auto prompt = random_tokens(rng, 4096 + 1);
  Sequence* first = cache->new_sequence().value();
  (void)cache->append(*first, prompt);
  (void)cache->commit(*first);
  for (auto _ : state) {
    Sequence* s = cache->new_sequence().value();
    benchmark::DoNotOptimize(cache->attach_prefix(*s, prompt, 4096).value());
    cache->release(s);
  }
  state.SetItemsProcessed(state.iterations() * 4096);  // tokens reused
}
BENCHMARK(BM_KvAttachPrefixMemory)->Unit(benchmark::kMicrosecond);

// Persisting a 4,096-token prefix (16 block files, each written, fsync'd and renamed), by zstd level.
void BM_KvDiskSavePrefix(benchmark::State& state) {
  const CacheGeometry g = v41_geometry();
  const std::string dir = bench_dir("save");
  DiskCacheOptions dopt;
  dopt.zstd_level = static_cast<int>(state.range(0));
  dopt.budget_bytes = 1ull << 30;
  auto disk = DiskPrefixCache::open(dir, g, dopt).value();
  KvCacheOptions o;
  o.capacity_blocks = 64;
  o.disk = disk.get();
  auto cache = KvCache::create(g, o).value();
  std::mt19937 rng(3);
  for (auto _ : state) {
    state.PauseTiming();
    Sequence* s = cache->new_sequence().value();
    (void)cache->append(*s, random_tokens(rng, 4096));
    fill_entries(*s, 0, rng);
    state.ResumeTiming();
    (void)cache->commit(*s);
    state.PauseTiming();
    cache->release(s);
    state.ResumeTiming();
  }
  const DiskCacheStats st = disk->stats();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 16 * g.block_bytes));
  state.counters["file_bytes_per_token"] =
      static_cast<double>(st.bytes) / static_cast<double>(st.files * g.block_tokens);
  cache.reset();
  disk.reset();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_KvDiskSavePrefix)->Arg(0)->Arg(1)->Arg(3)->Unit(benchmark::kMillisecond)->UseRealTime();

// Resuming a 4,096-token prefix from disk into a fresh cache (read, verify checksums, copy into the pool).
void BM_KvDiskLoadPrefix(benchmark::State& state) {
  const CacheGeometry g = v41_geometry();
  const std::string dir = bench_dir("load");
  DiskCacheOptions dopt;
  dopt.zstd_level = static_cast<int>(state.range(0));
  std::mt19937 rng(4);
  const auto prompt = random_tokens(rng, 4096 + 1);
  {
    auto disk = DiskPrefixCache::open(dir, g, dopt).value();
    KvCacheOptions o;
    o.capacity_blocks = 64;
    o.disk = disk.get();
    auto cache = KvCache::create(g, o).value();
    Sequence* s = cache->new_sequence().value();
    (void)cache->append(*s, prompt);
    fill_entries(*s, 0, rng);
    (void)cache->commit(*s);
  }
  auto disk = DiskPrefixCache::open(dir, g, dopt).value();
  for (auto _ : state) {
    KvCacheOptions o;
    o.capacity_blocks = 64;
    o.disk = disk.get();
    auto cache = KvCache::create(g, o).value();  // empty memory index: everything comes from disk
    Sequence* s = cache->new_sequence().value();
    benchmark::DoNotOptimize(cache->attach_prefix(*s, prompt, 4096).value());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 16 * g.block_bytes));
  disk.reset();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_KvDiskLoadPrefix)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace cedar::kv
