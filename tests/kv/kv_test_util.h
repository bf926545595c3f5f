// Cache layouts written by hand from the spec tables (spec §4.5 for V4.1, §1.3/§4.10 for V4-Flash,
// §5.5 for the dense 67B baseline), independent of the model module, plus a tiny layout for fast tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <xxhash.h>

#include <cstring>
#include <span>

#include "kv/file_ops.h"
#include "kv/geometry.h"
#include "kv/sequence.h"

namespace cedar::kv::testing {

// DeepSeek-V4.1-Flash: 40 backbone layers + 3 DSpark stages; sources 2, 8, 14 (ratio 2) and 20 (ratio 1).
inline ModelKvSpec v41_spec() {
  ModelKvSpec s;
  s.name = "deepseek-v4.1-flash";
  s.family = KvFamily::kV41;
  s.engram_history = 3;  // engram_max_ngram_size 4
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
  return s;
}

// DeepSeek-V4-Flash: 43 layers + 1 MTP; even layers 2..42 CSA ratio 4 (own indexer), odd 3..41 HCA 128.
inline ModelKvSpec v4_spec() {
  ModelKvSpec s;
  s.name = "deepseek-v4-flash";
  s.family = KvFamily::kV4;
  s.model_fingerprint = 4;
  for (int l = 0; l < 44; ++l) {
    LayerKvSpec e;
    e.layer = l;
    e.compress_ratio = l < 2 || l == 43 ? 0 : (l % 2 == 0 ? 4 : 128);
    if (e.compress_ratio > 0) {
      e.owns_compressed_kv = true;
      e.owns_index_keys = e.compress_ratio == 4;
      e.kv_from = l;
    }
    s.layers.push_back(e);
  }
  return s;
}

// DeepSeek LLM 67B: 95 layers, GQA with 8 KV heads of 128, bf16 K and V for every token.
inline ModelKvSpec dense67b_spec() {
  ModelKvSpec s;
  s.name = "deepseek-llm-67b";
  s.family = KvFamily::kDenseGqa;
  s.head_dim = 128;
  s.n_kv_heads = 8;
  s.window_size = 0;
  s.model_fingerprint = 67;
  for (int l = 0; l < 95; ++l) {
    LayerKvSpec e;
    e.layer = l;
    e.compress_ratio = 1;
    e.owns_compressed_kv = true;
    e.kv_from = l;
    e.has_window = false;
    s.layers.push_back(e);
  }
  return s;
}

// A small V4.1-shaped layout: layer 0 SWA, 1 source ratio 2, 2 reuse, 3 source ratio 1, 4 reindex.
// head_dim 64 -> 36-byte main entries, index 32 -> 17-byte keys, 66-byte window entries.
inline ModelKvSpec tiny_spec(uint64_t fingerprint = 7) {
  ModelKvSpec s;
  s.name = "tiny";
  s.family = KvFamily::kV41;
  s.head_dim = 64;
  s.index_head_dim = 32;
  s.window_size = 8;
  s.engram_history = 3;
  s.model_fingerprint = fingerprint;
  const int ratios[5] = {0, 2, 2, 1, 1};
  const int from[5] = {-1, 1, 1, 3, 3};
  for (int l = 0; l < 5; ++l) {
    LayerKvSpec e;
    e.layer = l;
    e.compress_ratio = ratios[l];
    e.kv_from = from[l];
    e.owns_compressed_kv = e.owns_index_keys = (l == 1 || l == 3);
    s.layers.push_back(e);
  }
  return s;
}

inline CacheGeometry tiny_geometry(uint32_t block_tokens = 4, uint64_t fingerprint = 7) {
  auto g = make_cache_geometry(tiny_spec(fingerprint), block_tokens);
  if (!g.ok()) __builtin_trap();
  return g.value();
}

// POSIX without fsync: for tests that write many files and do not test durability.
class NoSyncFileSystem : public FileSystem {
 public:
  int fsync(int) override { return 0; }
};

// Per-process root of the test directories, removed when the test process exits normally (a forked
// child never removes it: it only _exits or is killed).
struct TempRoot {
  pid_t owner = ::getpid();
  std::string path = ::testing::TempDir() + "cedar_kv_" + std::to_string(::getpid());
  ~TempRoot() {
    std::error_code ec;
    if (::getpid() == owner) std::filesystem::remove_all(path, ec);
  }
};
inline TempRoot& temp_root() {
  static TempRoot root;
  return root;
}

// A fresh, empty directory under the per-process test root.
inline std::string fresh_temp_dir(const std::string& name) {
  static int counter = 0;
  const std::string dir = temp_root().path + "/" + name + "_" + std::to_string(counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The "KV" of position p: a function of the token prefix [0, p], like real KV.
inline uint32_t marker(std::span<const int32_t> tokens, int64_t p) {
  return static_cast<uint32_t>(XXH3_64bits(tokens.data(), static_cast<size_t>(p + 1) * sizeof(int32_t)));
}

// Stands in for the forward pass: writes the entries of positions [from, n) of the tiny layout
// (owner 0 = layer 1, ratio 2; owner 1 = layer 3, ratio 1) and the boundary state of completed blocks.
inline void fake_forward(Sequence& s, int64_t from) {
  const auto t = s.tokens();
  for (int64_t p = from; p < s.n_tokens(); ++p) {
    const uint32_t m = marker(t, p);
    std::memcpy(s.main_entry_mut(1, p), &m, 4);
    std::memcpy(s.index_key_mut(1, p), &m, 4);
    if ((p + 1) % 2 == 0) std::memcpy(s.main_entry_mut(0, p / 2), &m, 4);
    std::memcpy(s.window_slot(0, p), &m, 4);
    // Engram history = the last 3 token ids (the real one holds compressed ids).
    auto h = s.engram_history();
    for (int k = 0; k < 3; ++k) h[k] = p - k >= 0 ? t[p - k] : -2;
    const uint32_t bt = s.geometry().block_tokens;
    if ((p + 1) % bt == 0) s.capture_boundary_state(static_cast<size_t>(p / bt));
  }
}

// Checks every complete entry of the sequence against the model.
inline void expect_content(const Sequence& s) {
  const auto t = s.tokens();
  for (int64_t p = 0; p < s.n_tokens(); ++p) {
    uint32_t got;
    std::memcpy(&got, s.main_entry(1, p), 4);
    ASSERT_EQ(got, marker(t, p)) << "seq " << s.id() << " ratio-1 entry " << p;
    std::memcpy(&got, s.index_key(1, p), 4);
    ASSERT_EQ(got, marker(t, p)) << "seq " << s.id() << " index key " << p;
  }
  for (int64_t j = 0; j < s.complete_entries(0); ++j) {
    uint32_t got;
    std::memcpy(&got, s.main_entry(0, j), 4);
    ASSERT_EQ(got, marker(t, 2 * j + 1)) << "seq " << s.id() << " ratio-2 entry " << j;
  }
}

inline std::vector<int32_t> iota_tokens(int n, int32_t start) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + i;
  return v;
}

}  // namespace cedar::kv::testing
