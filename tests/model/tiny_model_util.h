// A tiny checkpoint written once per test binary (library calls, same as `cedar make-tiny`) and
// helpers to run the model over it.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "model/model.h"
#include "tiny/tiny_checkpoint.h"

namespace cedar::model::testing {

// The tokenizer test checkpoints ship: the repository's DeepSeek-V4-series tokenizer (the default of
// `cedar make-tiny`, data/tokenizers/deepseek-v4), so the tests need nothing outside the repository.
inline std::string repo_tokenizer_dir() { return std::string(CEDAR_SOURCE_DIR) + "/data/tokenizers/deepseek-v4"; }

// The tiny preset, or (wide_kv) the same with a 128-entry window ring and top-128 selection (a
// candidate pool of 32 blocks of 4), so decode steps dequantise as many KV entries as the larger
// presets do.
inline ModelConfig tiny_test_config(bool wide_kv) {
  ModelConfig c = tiny_config(TinyPreset::kTiny);
  if (wide_kv) {
    c.window_size = 128;
    c.index_topk = 128;
    c.candidate_topk_blocks = 32;
  }
  return c;
}

inline std::string tiny_checkpoint(uint64_t seed, bool wide_kv = false) {
  static std::mutex mu;
  static std::map<std::pair<uint64_t, bool>, std::string> made;
  std::lock_guard<std::mutex> lock(mu);
  if (made.count({seed, wide_kv})) return made[{seed, wide_kv}];
  // CTest runs every test case as its own process, two at a time: write into a private folder and
  // rename it into place, so a process never sees another one's half-written checkpoint. The name
  // says which tokenizer the checkpoint ships, so a build folder holding checkpoints made with an
  // older test tokenizer (the V3 one) does not hand them to tests whose goldens expect the V4 one.
  const std::string dir = std::string(CEDAR_BINARY_DIR) + "/model_test_data/tiny_v4tok_" +
                          (wide_kv ? "widekv_" : "") + "seed" + std::to_string(seed);
  if (!std::filesystem::exists(dir + "/config.json")) {
    const std::string tmp = dir + ".tmp." + std::to_string(::getpid());
    std::filesystem::remove_all(tmp);
    auto tok = prepare_tiny_tokenizer(repo_tokenizer_dir());
    if (!tok.ok()) throw std::runtime_error(tok.status().to_string());
    ModelConfig c = tiny_test_config(wide_kv);
    c.engram_compressed_vocab_size = tok->engram_classes;
    TinyOptions opt;
    opt.out_dir = tmp;
    opt.seed = seed;
    opt.tokenizer = &*tok;
    Status st = write_tiny_checkpoint(c, opt);
    if (!st.ok()) throw std::runtime_error(st.to_string());
    std::error_code ec;
    std::filesystem::rename(tmp, dir, ec);  // fails if another process got there first: use theirs
    if (ec) std::filesystem::remove_all(tmp);
  }
  made[{seed, wide_kv}] = dir;
  return dir;
}

inline std::unique_ptr<Model> load_tiny(uint64_t seed, IndexKeyMode mode = IndexKeyMode::kReference,
                                        bool wide_kv = false) {
  ModelOptions o;
  o.index_keys = mode;
  auto m = Model::load(tiny_checkpoint(seed, wide_kv), o);
  if (!m.ok()) throw std::runtime_error(m.status().to_string());
  return std::move(*m);
}

// Deterministic prompt of n ids below the tokenizer's size (Engram needs ids it can map).
inline std::vector<int32_t> test_prompt(size_t n, uint32_t salt = 0) {
  std::vector<int32_t> ids(n);
  uint64_t x = 0x9E3779B97F4A7C15ull ^ salt;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = static_cast<int32_t>((x >> 33) % 128000);
  }
  return ids;
}

}  // namespace cedar::model::testing
