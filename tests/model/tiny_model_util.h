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
#include "ops/formats/formats.h"
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

// Writes a tiny checkpoint of config `c` (its Engram classes set from the test tokenizer) into `dir`.
// CTest runs every test case as its own process, two at a time: it is written into a private folder
// and renamed into place, so a process never sees another one's half-written checkpoint.
inline void write_tiny_into(const std::string& dir, ModelConfig c, uint64_t seed) {
  const std::string tmp = dir + ".tmp." + std::to_string(::getpid());
  std::filesystem::remove_all(tmp);
  auto tok = prepare_tiny_tokenizer(repo_tokenizer_dir());
  if (!tok.ok()) throw std::runtime_error(tok.status().to_string());
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

inline std::string tiny_checkpoint(uint64_t seed, bool wide_kv = false) {
  static std::mutex mu;
  static std::map<std::pair<uint64_t, bool>, std::string> made;
  std::lock_guard<std::mutex> lock(mu);
  if (made.count({seed, wide_kv})) return made[{seed, wide_kv}];
  // The name says which tokenizer the checkpoint ships, so a build folder holding checkpoints made with an
  // older test tokenizer (the V3 one) does not hand them to tests whose goldens expect the V4 one.
  const std::string dir = std::string(CEDAR_BINARY_DIR) + "/model_test_data/tiny_v4tok_" +
                          (wide_kv ? "widekv_" : "") + "seed" + std::to_string(seed);
  if (!std::filesystem::exists(dir + "/config.json")) write_tiny_into(dir, tiny_test_config(wide_kv), seed);
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

// The checkpoint of `cedar make-tiny --vision --seed N` (the tiny preset with a 2-block tower),
// written once per build folder.
inline std::string vision_checkpoint(uint64_t seed) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const std::string dir = std::string(CEDAR_BINARY_DIR) + "/model_test_data/tiny_vision_seed" + std::to_string(seed);
  if (!std::filesystem::exists(dir + "/config.json")) {
    ModelConfig c = tiny_config(TinyPreset::kTiny);
    c.vision = tiny_vision_config();
    write_tiny_into(dir, c, seed);
  }
  return dir;
}

// The goldens' patch grid (tools/golden/vision_reference.py make_patches): pixel bytes from a fixed
// formula, normalised as the processor does, [n_h * n_w][3 * p * p] bf16 bits.
inline std::vector<uint16_t> golden_patches(int n_h, int n_w, int p, int salt) {
  std::vector<uint16_t> patches;
  for (int ph = 0; ph < n_h; ++ph)
    for (int pw = 0; pw < n_w; ++pw)
      for (int ch = 0; ch < 3; ++ch)
        for (int i = 0; i < p; ++i)
          for (int j = 0; j < p; ++j) {
            const int row = ph * p + i, col = pw * p + j;
            const int v = (row * 37 + col * 11 + ch * 101 + (row * col) % 7 + n_w * 5 + salt * 13) % 256;
            const float x = static_cast<float>(v) / 255.0f;
            patches.push_back(ops::f32_to_bf16_bits((x - 0.5f) / 0.5f));
          }
  return patches;
}

// An image span at `start` of a golden_patches grid, its token types written out from
// image_processor.py's docstring: IMAGE_START, then per row ceil(n_w / 3) IMAGE and one
// IMAGE_NEW_LINE (ceil(n_h / 3) rows), then IMAGE_END.
inline ImageSpan golden_span(int64_t start, int n_h, int n_w, int salt, int patch) {
  ImageSpan s;
  s.start = start;
  s.n_vit_h = n_h;
  s.n_vit_w = n_w;
  s.patches = golden_patches(n_h, n_w, patch, salt);
  s.name = "grid " + std::to_string(n_h) + "x" + std::to_string(n_w) + " salt " + std::to_string(salt);
  s.content_sha256[0] = static_cast<uint8_t>(salt);
  s.types.push_back(kImageStart);
  for (int r = 0; r < (n_h + 2) / 3; ++r) {
    s.types.insert(s.types.end(), (n_w + 2) / 3, kImageToken);
    s.types.push_back(kImageNewLine);
  }
  s.types.push_back(kImageEnd);
  return s;
}

}  // namespace cedar::model::testing
