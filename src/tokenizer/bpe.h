// The BPE model of a tokenizer.json: vocabulary, merges by rank, and the per-word merge loop of
// Hugging Face's `tokenizers` (repeatedly merge the adjacent pair of lowest rank, leftmost first).
// Internal to the tokenizer module.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace cedar::tokenizer {

using TokenId = int32_t;

// Open-addressing map from a pair of symbol ids to (rank, merged id). Lookups sit in the inner
// merge loop, so this avoids std::unordered_map's node chasing.
class MergeTable {
 public:
  struct Entry {
    uint64_t key = kEmpty;  // (left << 32) | right
    int32_t rank = 0;
    TokenId merged = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  void reserve(size_t n);
  // A later entry for the same pair replaces the earlier one, as in Hugging Face (whose merge map
  // is collected from the merges list in order).
  void insert(TokenId left, TokenId right, int32_t rank, TokenId merged);
  const Entry* find(TokenId left, TokenId right) const {
    const uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
    size_t i = hash(key) & mask_;
    while (true) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return size_; }

 private:
  static uint64_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
  }
  std::vector<Entry> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

class BpeModel {
 public:
  // The vocabulary and merges of a tokenizer.json "model", pulled out while parsing so that the
  // large tables never become a JSON DOM (see Tokenizer::from_json).
  struct Tables {
    std::vector<std::pair<std::string, int64_t>> vocab;        // token -> id, file order
    std::vector<std::pair<std::string, std::string>> merges;   // (left, right), by rank
    std::string error;  // the first malformed entry, if any
  };

  // Builds the model from tokenizer.json's "model" object. `byte_level` says whether words arrive
  // as raw bytes read through the byte-level alphabet (a ByteLevel pre-tokenizer) or as text.
  static Result<std::unique_ptr<BpeModel>> from_json(const nlohmann::json& model, bool byte_level);
  // The same with the vocab and merges given separately (`model` holds the other fields).
  static Result<std::unique_ptr<BpeModel>> from_tables(const nlohmann::json& model, Tables tables, bool byte_level);
  // Extracts the tables from a complete "model" object.
  static Result<Tables> tables_from_json(const nlohmann::json& model);

  // Appends the ids of one pre-tokenised word (no caching here; the tokenizer caches words).
  void tokenize_word(std::string_view word, std::vector<TokenId>* out) const;

  // The merge loop on an initial symbol sequence (exposed for tests): merges in place.
  void merge_symbols(std::vector<TokenId>* symbols) const;

  const std::vector<std::string>& id_to_token() const { return id_to_token_; }
  const std::unordered_map<std::string, TokenId>& token_to_id() const { return token_to_id_; }
  const MergeTable& merges() const { return merges_; }

 private:
  BpeModel() = default;
  void initial_symbols(std::string_view word, std::vector<TokenId>* symbols) const;
  void merge_small(std::vector<TokenId>* symbols) const;
  void merge_heap(std::vector<TokenId>* symbols) const;

  bool byte_level_ = false;
  std::vector<std::string> id_to_token_;  // "" for ids absent from the vocab
  std::unordered_map<std::string, TokenId> token_to_id_;
  MergeTable merges_;
  TokenId byte_symbol_[256];  // byte-level: the id of each byte's alphabet char (-1 if missing)
  std::optional<TokenId> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
};

}  // namespace cedar::tokenizer
