// Tokenizer throughput on one core: encode and decode MB/s over the 1.2 MB real-text corpus of the
// tokenizer tests (tests/tokenizer/data/corpus), with the DeepSeek-V3 tokenizer of ../shared where
// it exists (the figures of docs/TOKENIZER.md), otherwise the repository's V4-series one
// (data/tokenizers/deepseek-v4). Compare with Hugging Face's Rust tokenizer on the same texts:
// tools/tokenizer/bench_hf.py.
// Run: build/bench/cedar_bench --benchmark_filter=Tokenizer
#include <benchmark/benchmark.h>

#include <zstd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/engram_token_map.h"
#include "tokenizer/tokenizer.h"

namespace cedar::tokenizer {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    const std::string dir = CEDAR_SOURCE_DIR "/tests/tokenizer/data/corpus";
    std::vector<std::string> paths;
    for (const auto& e : std::filesystem::directory_iterator(dir)) paths.push_back(e.path().string());
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
      const std::string packed = read_file(p);
      const auto size = ZSTD_getFrameContentSize(packed.data(), packed.size());
      std::string text(size, '\0');
      ZSTD_decompress(text.data(), text.size(), packed.data(), packed.size());
      out.push_back(std::move(text));
    }
    return out;
  }();
  return texts;
}

const Tokenizer& bench_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    std::string dir = CEDAR_SOURCE_DIR "/../shared/tokenizers/deepseek-v3";
    if (!std::filesystem::exists(dir + "/tokenizer.json")) dir = CEDAR_SOURCE_DIR "/data/tokenizers/deepseek-v4";
    std::fprintf(stderr, "tokenizer benchmarks: %s\n", dir.c_str());
    auto r = Tokenizer::load_dir(dir);
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
      std::abort();
    }
    return std::move(r).value();
  }();
  return *tok;
}

void BM_TokenizerEncodeCorpus(benchmark::State& state) {
  const Tokenizer& tok = bench_tokenizer();
  size_t bytes = 0, ids = 0;
  for (auto _ : state) {
    for (const auto& text : corpus()) {
      auto r = tok.encode(text);
      ids += r->size();
      bytes += text.size();
      benchmark::DoNotOptimize(r->data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["ids/s"] = benchmark::Counter(static_cast<double>(ids), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_TokenizerEncodeCorpus)->Unit(benchmark::kMillisecond);

void BM_TokenizerDecodeCorpus(benchmark::State& state) {
  const Tokenizer& tok = bench_tokenizer();
  std::vector<std::vector<TokenId>> encoded;
  for (const auto& text : corpus()) encoded.push_back(*tok.encode(text));
  size_t bytes = 0;
  for (auto _ : state) {
    for (const auto& ids : encoded) {
      auto text = tok.decode(ids);
      bytes += text->size();
      benchmark::DoNotOptimize(text->data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_TokenizerDecodeCorpus)->Unit(benchmark::kMillisecond);

void BM_TokenizerEngramMap(benchmark::State& state) {
  const Tokenizer& tok = bench_tokenizer();
  for (auto _ : state) {
    int n = 0;
    benchmark::DoNotOptimize(build_engram_token_map(tok, &n).data());
  }
}
BENCHMARK(BM_TokenizerEngramMap)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace cedar::tokenizer
