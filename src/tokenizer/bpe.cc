#include "tokenizer/bpe.h"

#include <climits>
#include <cstdio>
#include <queue>

#include "tokenizer/utf8.h"

namespace cedar::tokenizer {

using json = nlohmann::json;

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Entry{});
  mask_ = cap - 1;
  size_ = 0;
}

void MergeTable::insert(TokenId left, TokenId right, int32_t rank, TokenId merged) {
  if (size_ * 2 + 2 > slots_.size()) {
    std::vector<Entry> old = std::move(slots_);
    reserve(old.size() + 8);
    for (const Entry& e : old) {
      if (e.key != kEmpty) insert(TokenId(e.key >> 32), TokenId(uint32_t(e.key)), e.rank, e.merged);
    }
  }
  const uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  size_t i = hash(key) & mask_;
  while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
  if (slots_[i].key == kEmpty) ++size_;
  slots_[i] = {key, rank, merged};
}

Result<BpeModel::Tables> BpeModel::tables_from_json(const json& model) {
  if (!model.is_object()) return invalid_argument("tokenizer.json: \"model\" must be an object");
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return invalid_argument("tokenizer.json: model.vocab must be an object of token -> id");
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return invalid_argument("tokenizer.json: model.merges must be an array");
  }
  Tables t;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) return invalid_argument("tokenizer.json: model.vocab['" + it.key() + "'] is not an id");
    t.vocab.emplace_back(it.key(), it.value().get<int64_t>());
  }
  const json& merges = model["merges"];
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& entry = merges[rank];
    if (entry.is_string()) {  // "left right"
      const std::string& m = entry.get_ref<const std::string&>();
      const size_t sp = m.find(' ');
      if (sp == std::string::npos || m.find(' ', sp + 1) != std::string::npos) {
        return invalid_argument("tokenizer.json: model.merges[" + std::to_string(rank) + "] = '" + m +
                                "' is not two tokens separated by one space");
      }
      t.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
      t.merges.emplace_back(entry[0].get<std::string>(), entry[1].get<std::string>());
    } else {
      return invalid_argument("tokenizer.json: model.merges[" + std::to_string(rank) + "] must be \"a b\" or [\"a\", \"b\"]");
    }
  }
  return t;
}

Result<std::unique_ptr<BpeModel>> BpeModel::from_json(const json& model, bool byte_level) {
  CEDAR_ASSIGN_OR_RETURN(Tables tables, tables_from_json(model));
  return from_tables(model, std::move(tables), byte_level);
}

Result<std::unique_ptr<BpeModel>> BpeModel::from_tables(const json& model, Tables tables, bool byte_level) {
  if (!model.is_object()) return invalid_argument("tokenizer.json: \"model\" must be an object");
  if (!tables.error.empty()) return invalid_argument("tokenizer.json: " + tables.error);
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") {
    return unimplemented("tokenizer.json: model type '" + type + "' is not supported by cedar (only BPE)");
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"].get<double>() > 0) {
    return unimplemented("tokenizer.json: BPE dropout is training-only and not supported for inference");
  }
  std::unique_ptr<BpeModel> m(new BpeModel());
  m->byte_level_ = byte_level;
  m->fuse_unk_ = model.value("fuse_unk", false);
  m->byte_fallback_ = model.value("byte_fallback", false);
  m->ignore_merges_ = model.value("ignore_merges", false);
  if (model.contains("continuing_subword_prefix") && model["continuing_subword_prefix"].is_string()) {
    m->continuing_subword_prefix_ = model["continuing_subword_prefix"].get<std::string>();
  }
  if (model.contains("end_of_word_suffix") && model["end_of_word_suffix"].is_string()) {
    m->end_of_word_suffix_ = model["end_of_word_suffix"].get<std::string>();
  }

  m->token_to_id_.reserve(tables.vocab.size() * 2);
  TokenId max_id = -1;
  for (auto& [tok, raw_id] : tables.vocab) {
    // Ids far beyond any real vocabulary would make the per-id tables allocate gigabytes.
    if (raw_id < 0 || raw_id > (16 << 20)) {
      return invalid_argument("tokenizer.json: model.vocab['" + tok + "'] = " + std::to_string(raw_id) +
                              " is not a valid id");
    }
    const auto id = static_cast<TokenId>(raw_id);
    max_id = std::max(max_id, id);
    m->token_to_id_[std::move(tok)] = id;
  }
  m->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : m->token_to_id_) m->id_to_token_[id] = tok;

  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = m->token_to_id_.find(model["unk_token"].get<std::string>());
    if (it == m->token_to_id_.end()) {
      return invalid_argument("tokenizer.json: model.unk_token '" + model["unk_token"].get<std::string>() +
                              "' is not in the vocab");
    }
    m->unk_id_ = it->second;
  }

  m->merges_.reserve(tables.merges.size());
  const size_t prefix_len = m->continuing_subword_prefix_.size();
  std::string merged;
  for (size_t rank = 0; rank < tables.merges.size(); ++rank) {
    const auto& [left, right] = tables.merges[rank];
    auto li = m->token_to_id_.find(left);
    auto ri = m->token_to_id_.find(right);
    if (li == m->token_to_id_.end() || ri == m->token_to_id_.end()) {
      return invalid_argument("tokenizer.json: model.merges[" + std::to_string(rank) + "] uses a token not in the vocab ('" +
                              left + "' + '" + right + "')");
    }
    merged = left;
    if (prefix_len && right.compare(0, prefix_len, m->continuing_subword_prefix_) == 0) {
      merged.append(right, prefix_len, std::string::npos);
    } else {
      merged += right;
    }
    auto mi = m->token_to_id_.find(merged);
    if (mi == m->token_to_id_.end()) {
      return invalid_argument("tokenizer.json: model.merges[" + std::to_string(rank) + "] produces '" + merged +
                              "', which is not in the vocab");
    }
    m->merges_.insert(li->second, ri->second, static_cast<int32_t>(rank), mi->second);
  }

  const auto& alphabet = byte_to_char();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(alphabet[b], &ch);
    auto it = m->token_to_id_.find(ch);
    m->byte_symbol_[b] = it == m->token_to_id_.end() ? -1 : it->second;
  }
  return m;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<TokenId>* symbols) const {
  symbols->clear();
  if (byte_level_) {
    // Hugging Face drops a symbol that is not in the vocab when there is no unk token.
    for (unsigned char b : word) {
      const TokenId id = byte_symbol_[b];
      if (id >= 0) {
        symbols->push_back(id);
      } else if (unk_id_) {
        if (!(fuse_unk_ && !symbols->empty() && symbols->back() == *unk_id_)) symbols->push_back(*unk_id_);
      }
    }
    return;
  }
  std::string key;
  bool prev_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    next_code_point(word, &i);
    key.clear();
    if (start > 0) key += continuing_subword_prefix_;
    key.append(word.substr(start, i - start));
    if (i == word.size()) key += end_of_word_suffix_;
    auto it = token_to_id_.find(key);
    if (it != token_to_id_.end()) {
      symbols->push_back(it->second);
      prev_unk = false;
      continue;
    }
    if (byte_fallback_) {
      // One <0xXX> token per byte, used only if every one of them exists.
      std::vector<TokenId> bytes;
      for (size_t k = start; k < i; ++k) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(word[k]));
        auto bt = token_to_id_.find(name);
        if (bt == token_to_id_.end()) {
          bytes.clear();
          break;
        }
        bytes.push_back(bt->second);
      }
      if (!bytes.empty()) {
        symbols->insert(symbols->end(), bytes.begin(), bytes.end());
        prev_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && prev_unk)) symbols->push_back(*unk_id_);
      prev_unk = true;
    }
  }
}

void BpeModel::merge_small(std::vector<TokenId>* symbols) const {
  // [n_symbols - 1] rank of each adjacent pair (INT_MAX: no merge), and the merged id.
  std::vector<TokenId>& s = *symbols;
  thread_local std::vector<int32_t> rank;
  thread_local std::vector<TokenId> merged;
  const size_t n = s.size();
  rank.resize(n);
  merged.resize(n);
  auto set_pair = [&](size_t i) {
    const MergeTable::Entry* e = merges_.find(s[i], s[i + 1]);
    rank[i] = e ? e->rank : INT_MAX;
    merged[i] = e ? e->merged : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) set_pair(i);
  size_t len = n;
  while (len > 1) {
    size_t best = 0;
    int32_t best_rank = INT_MAX;
    for (size_t i = 0; i + 1 < len; ++i) {
      if (rank[i] < best_rank) {
        best_rank = rank[i];
        best = i;
      }
    }
    if (best_rank == INT_MAX) break;
    s[best] = merged[best];
    for (size_t i = best + 1; i + 1 < len; ++i) {
      s[i] = s[i + 1];
      rank[i] = rank[i + 1];
      merged[i] = merged[i + 1];
    }
    --len;
    if (best > 0) set_pair(best - 1);
    if (best + 1 < len) set_pair(best);
  }
  s.resize(len);
}

void BpeModel::merge_heap(std::vector<TokenId>* symbols) const {
  // Hugging Face's Word::merge_all: a min-heap of (rank, position) over a linked list of symbols;
  // entries whose pair has changed since they were pushed are skipped when popped.
  std::vector<TokenId>& s = *symbols;
  const int n = static_cast<int>(s.size());
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Item {
    int32_t rank;
    int pos;
    TokenId merged;
    bool operator>(const Item& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  for (int i = 0; i + 1 < n; ++i) {
    if (const auto* e = merges_.find(s[i], s[i + 1])) heap.push({e->rank, i, e->merged});
  }
  while (!heap.empty()) {
    const Item top = heap.top();
    heap.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const int right = next[top.pos];
    const MergeTable::Entry* cur = merges_.find(s[top.pos], s[right]);
    if (!cur || cur->merged != top.merged) continue;  // stale entry
    s[top.pos] = top.merged;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) {
      const int p = prev[top.pos];
      if (const auto* e = merges_.find(s[p], s[top.pos])) heap.push({e->rank, p, e->merged});
    }
    if (next[top.pos] >= 0) {
      if (const auto* e = merges_.find(s[top.pos], s[next[top.pos]])) heap.push({e->rank, top.pos, e->merged});
    }
  }
  size_t w = 0;
  for (int i = 0; i < n; ++i) {
    if (alive[i]) s[w++] = s[i];
  }
  s.resize(w);
}

void BpeModel::merge_symbols(std::vector<TokenId>* symbols) const {
  // Both loops merge the current pair of lowest (rank, position); the quadratic scan is faster
  // for the short words that make up almost all text.
  if (symbols->size() <= 48) {
    merge_small(symbols);
  } else {
    merge_heap(symbols);
  }
}

void BpeModel::tokenize_word(std::string_view word, std::vector<TokenId>* out) const {
  if (ignore_merges_) {
    std::string key;
    if (byte_level_) {
      for (unsigned char b : word) append_utf8(byte_to_char()[b], &key);
    } else {
      key = std::string(word);
    }
    auto it = token_to_id_.find(key);
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  thread_local std::vector<TokenId> symbols;
  initial_symbols(word, &symbols);
  if (symbols.size() > 1) merge_symbols(&symbols);
  out->insert(out->end(), symbols.begin(), symbols.end());
}

}  // namespace cedar::tokenizer
