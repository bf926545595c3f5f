#include "tokenizer/tokenizer.h"

#include <unicode/uchar.h>
#include <xxhash.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/file.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/utf8.h"

namespace cedar::tokenizer {
namespace {

using json = nlohmann::json;

// A byte trie over added-token contents for leftmost-longest matching (what Hugging Face's
// Aho-Corasick automaton with MatchKind::LeftmostLongest finds).
class TokenTrie {
 public:
  TokenTrie() : nodes_(1) {}
  void insert(std::string_view text, int token_index) {
    if (text.empty()) return;
    int node = 0;
    for (unsigned char c : text) {
      int child = find_child(node, c);
      if (child < 0) {
        child = static_cast<int>(nodes_.size());
        nodes_[node].children.push_back({c, child});
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].token = token_index;
    first_byte_[static_cast<unsigned char>(text[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }

  // Longest token starting at `pos`: returns its length and sets *token_index, or returns 0.
  size_t longest_at(std::string_view s, size_t pos, int* token_index) const {
    if (!first_byte_[static_cast<unsigned char>(s[pos])]) return 0;
    int node = 0;
    size_t best = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      node = find_child(node, static_cast<unsigned char>(s[i]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        best = i + 1 - pos;
        *token_index = nodes_[node].token;
      }
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> children;
    int token = -1;
  };
  int find_child(int node, unsigned char c) const {
    for (const auto& [ch, idx] : nodes_[node].children) {
      if (ch == c) return idx;
    }
    return -1;
  }
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
  bool empty_ = true;
};

// A text segment: either an added token (id >= 0) or a byte range of text still to tokenize.
struct Segment {
  TokenId id;
  size_t begin, end;
};

// Word -> ids cache, one per thread (see Scratch). Open addressing over an arena of keys and ids,
// dropped wholesale when full: a cache, not a store, so eviction order does not matter.
class WordCache {
 public:
  WordCache() { slots_.assign(kSlots, Slot{}); }
  void clear() {
    if (used_ == 0) return;
    slots_.assign(kSlots, Slot{});
    keys_.clear();
    ids_.clear();
    used_ = 0;
  }
  // Returns the cached ids of `word`, or nullptr.
  const TokenId* find(std::string_view word, uint64_t h, uint32_t* n_ids) const {
    size_t i = h & (kSlots - 1);
    while (true) {
      const Slot& s = slots_[i];
      if (s.key_len == kEmpty) return nullptr;
      if (s.hash == h && s.key_len == word.size() && std::memcmp(keys_.data() + s.key_off, word.data(), word.size()) == 0) {
        *n_ids = s.ids_len;
        return ids_.data() + s.ids_off;
      }
      i = (i + 1) & (kSlots - 1);
    }
  }
  void insert(std::string_view word, uint64_t h, const TokenId* ids, uint32_t n_ids) {
    if (used_ * 2 >= kSlots || keys_.size() > kMaxArenaBytes) clear();
    size_t i = h & (kSlots - 1);
    while (slots_[i].key_len != kEmpty) i = (i + 1) & (kSlots - 1);
    slots_[i] = {h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(word.size()),
                 static_cast<uint32_t>(ids_.size()), n_ids};
    keys_.append(word);
    ids_.insert(ids_.end(), ids, ids + n_ids);
    ++used_;
  }

 private:
  static constexpr size_t kSlots = 1 << 16;
  static constexpr size_t kMaxArenaBytes = 8 << 20;
  static constexpr uint32_t kEmpty = ~uint32_t{0};
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_off = 0;
    uint32_t key_len = kEmpty;
    uint32_t ids_off = 0;
    uint32_t ids_len = 0;
  };
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<TokenId> ids_;
  size_t used_ = 0;
};

// Per-thread working memory, so encode() allocates nothing once warm and needs no lock.
struct Scratch {
  uint64_t owner = 0;  // the Tokenizer instance whose words are cached
  WordCache cache;
  std::string buffer;
  std::vector<Piece> pieces;
  std::vector<Segment> segments, sub_segments;
  std::vector<TokenId> word_ids;
};

Scratch& thread_scratch(uint64_t owner) {
  thread_local Scratch scratch;
  if (scratch.owner != owner) {
    scratch.cache.clear();
    scratch.owner = owner;
  }
  return scratch;
}

std::atomic<uint64_t> g_next_instance{1};

// The content of a tokenizer_config.json token entry: "text" or {"content": "text", ...}.
std::optional<std::string> config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return std::nullopt;
}

// transformers' clean_up_tokenization (applied when clean_up_tokenization_spaces is true).
std::string clean_up_tokenization(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    const std::string_view f(from);
    std::string out;
    size_t prev = 0, pos;
    while ((pos = s.find(f, prev)) != std::string::npos) {
      out.append(s, prev, pos - prev);
      out.append(to);
      prev = pos + f.size();
    }
    out.append(s, prev, std::string::npos);
    s = std::move(out);
  }
  return s;
}

}  // namespace

struct Tokenizer::Impl {
  uint64_t instance = 0;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Normalizer> normalizer;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;
  TokenTrie raw_trie;         // tokens with normalized=false, matched in the raw text
  TokenTrie normalized_trie;  // tokens with normalized=true, matched after normalisation
  std::vector<std::string> id_to_token;  // added tokens override the model's strings
  std::vector<uint8_t> special;          // [vocab_size] 1 for special added tokens
  std::vector<uint8_t> assigned;         // [vocab_size] 1 for ids that exist
  std::vector<std::string> token_bytes;  // [vocab_size] byte-level decoder output per id
  std::unordered_map<std::string, TokenId> added_to_id;
  std::vector<TokenId> prefix_ids, suffix_ids;  // what add_special puts around the text
  std::optional<TokenId> bos, eos;
  bool adds_bos = false, adds_eos = false;
  bool clean_up_spaces = false;

  // Splits `text` on the tokens of `trie` (Hugging Face's AddedVocabulary::find_matches).
  void split_added(std::string_view text, size_t base, const TokenTrie& trie, std::vector<Segment>* out) const {
    if (trie.empty()) {
      if (!text.empty()) out->push_back({-1, base, base + text.size()});
      return;
    }
    size_t start_offset = 0, pos = 0;
    while (pos < text.size()) {
      int index = -1;
      const size_t len = trie.longest_at(text, pos, &index);
      if (len == 0) {
        ++pos;
        continue;
      }
      const AddedToken& tok = added[static_cast<size_t>(index)];
      size_t start = pos, stop = pos + len;
      pos = stop;  // matches never overlap, even when one is rejected below
      if (tok.single_word && !single_word_ok(text, start, stop)) continue;
      if (start < start_offset) continue;
      if (tok.lstrip) {
        size_t s = start;
        while (s > start_offset) {
          size_t b = s - 1;
          while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
          size_t tmp = b;
          if (!unicode_white_space(next_code_point(text, &tmp))) break;
          s = b;
        }
        start = s;
      }
      if (tok.rstrip) {
        while (stop < text.size()) {
          size_t tmp = stop;
          if (!unicode_white_space(next_code_point(text, &tmp))) break;
          stop = tmp;
        }
        pos = stop;
      }
      if (start_offset < start) out->push_back({-1, base + start_offset, base + start});
      out->push_back({tok.id, base + start, base + stop});
      start_offset = stop;
    }
    if (start_offset < text.size()) out->push_back({-1, base + start_offset, base + text.size()});
  }

  static bool is_word_char(char32_t c) {
    // Hugging Face tests single_word neighbours with the regex `\w` of Rust's regex crate:
    // Alphabetic, marks, decimal digits, connector punctuation and the joiners.
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const auto u = static_cast<UChar32>(c);
    const int8_t t = u_charType(u);
    return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK ||
           t == U_COMBINING_SPACING_MARK || t == U_DECIMAL_DIGIT_NUMBER || t == U_CONNECTOR_PUNCTUATION ||
           u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL);
  }
  static bool single_word_ok(std::string_view text, size_t start, size_t stop) {
    if (start > 0) {
      size_t b = start - 1;
      while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
      size_t tmp = b;
      if (is_word_char(next_code_point(text, &tmp))) return false;
    }
    if (stop < text.size()) {
      size_t tmp = stop;
      if (is_word_char(next_code_point(text, &tmp))) return false;
    }
    return true;
  }

  // Pre-tokenises and BPE-encodes one run of text that holds no added token.
  Status encode_plain(std::string_view text, Scratch& sc, std::vector<TokenId>* out) const {
    sc.buffer.assign(text);
    sc.pieces.clear();
    sc.pieces.push_back({0, static_cast<uint32_t>(sc.buffer.size())});
    for (const auto& step : pre_tokenizer.steps) CEDAR_RETURN_IF_ERROR(step->apply(&sc.buffer, &sc.pieces));
    for (const Piece& p : sc.pieces) {
      const std::string_view word(sc.buffer.data() + p.begin, p.end - p.begin);
      if (word.empty()) continue;
      if (word.size() > 256) {  // long words are rare: do not let them flush the cache
        model->tokenize_word(word, out);
        continue;
      }
      const uint64_t h = XXH3_64bits(word.data(), word.size());
      uint32_t n = 0;
      if (const TokenId* hit = sc.cache.find(word, h, &n)) {
        out->insert(out->end(), hit, hit + n);
        continue;
      }
      sc.word_ids.clear();
      model->tokenize_word(word, &sc.word_ids);
      sc.cache.insert(word, h, sc.word_ids.data(), static_cast<uint32_t>(sc.word_ids.size()));
      out->insert(out->end(), sc.word_ids.begin(), sc.word_ids.end());
    }
    return {};
  }

  // Plain text: no added token is split out, so a marker spelled in the text is encoded like any
  // other characters (what DeepSeek's prompt encoding does between its special ranges).
  Status encode_without_added(std::string_view text, std::vector<TokenId>* out) const {
    const size_t valid = valid_utf8_prefix(text);
    if (valid != text.size()) {
      return invalid_argument("text to encode is not valid UTF-8 (first bad byte at offset " + std::to_string(valid) +
                              "); convert it to UTF-8 first");
    }
    Scratch& sc = thread_scratch(instance);
    if (!normalizer) return encode_plain(text, sc, out);
    std::string normalized(text);
    CEDAR_RETURN_IF_ERROR(normalizer->apply(&normalized));
    return encode_plain(normalized, sc, out);
  }

  Status encode(std::string_view text, std::vector<TokenId>* out) const {
    const size_t valid = valid_utf8_prefix(text);
    if (valid != text.size()) {
      return invalid_argument("text to encode is not valid UTF-8 (first bad byte at offset " + std::to_string(valid) +
                              "); convert it to UTF-8 first");
    }
    Scratch& sc = thread_scratch(instance);
    std::vector<Segment> segments;
    split_added(text, 0, raw_trie, &segments);
    for (const Segment& seg : segments) {
      if (seg.id >= 0) {
        out->push_back(seg.id);
        continue;
      }
      std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
      std::string normalized;
      if (normalizer) {
        normalized.assign(piece);
        CEDAR_RETURN_IF_ERROR(normalizer->apply(&normalized));
        piece = normalized;
      }
      if (normalized_trie.empty()) {
        CEDAR_RETURN_IF_ERROR(encode_plain(piece, sc, out));
        continue;
      }
      std::vector<Segment> subs;
      split_added(piece, 0, normalized_trie, &subs);
      for (const Segment& sub : subs) {
        if (sub.id >= 0) {
          out->push_back(sub.id);
        } else {
          CEDAR_RETURN_IF_ERROR(encode_plain(piece.substr(sub.begin, sub.end - sub.begin), sc, out));
        }
      }
    }
    return {};
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& tokenizer_json_path,
                                                   const std::string& config_path) {
  CEDAR_ASSIGN_OR_RETURN(std::string tj, read_whole_file(tokenizer_json_path));
  std::string cj;
  if (!config_path.empty()) {
    CEDAR_ASSIGN_OR_RETURN(cj, read_whole_file(config_path));
  }
  return from_json(tj, cj, tokenizer_json_path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load_dir(const std::string& dir) {
  const std::string config = dir + "/tokenizer_config.json";
  std::ifstream probe(config);
  return load(dir + "/tokenizer.json", probe ? config : "");
}

namespace {
// Ids beyond this are refused: no real vocabulary comes close, and a hostile file must not make
// the per-id tables allocate gigabytes.
constexpr int64_t kMaxTokenId = 16 * 1024 * 1024;
}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                                                        const std::string& source) {
  // Field-type surprises anywhere below (a string where an id belongs) become a DataLoss error.
  try {
    return from_json_checked(tokenizer_json, config_json, source);
  } catch (const json::exception& e) {
    return data_loss(source + ": unexpected field type or value: " + e.what());
  }
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json_checked(std::string_view tokenizer_json,
                                                                std::string_view config_json,
                                                                const std::string& source) {
  // model.vocab and model.merges (hundreds of thousands of entries) go straight into tables as
  // they are parsed instead of into the JSON DOM, which would cost most of the load time.
  BpeModel::Tables tables;
  std::string key1, key2, vocab_key;
  auto in_model = [&](const char* field) { return key1 == "model" && key2 == field; };
  auto capture = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    using E = json::parse_event_t;
    if (event == E::key) {
      if (depth == 1) {
        key1 = parsed.get<std::string>();
        key2.clear();
      } else if (depth == 2) {
        key2 = parsed.get<std::string>();
      } else if (depth == 3 && in_model("vocab")) {
        vocab_key = parsed.get<std::string>();
        return false;
      }
      return true;
    }
    if (depth != 3) return true;
    if (event == E::value && in_model("vocab")) {
      if (parsed.is_number_integer()) {
        tables.vocab.emplace_back(std::move(vocab_key), parsed.get<int64_t>());
      } else if (tables.error.empty()) {
        tables.error = "model.vocab['" + vocab_key + "'] is not an id";
      }
      return false;
    }
    if (in_model("merges") && (event == E::value || event == E::array_end)) {
      const size_t rank = tables.merges.size();
      if (parsed.is_string()) {  // "left right"
        const std::string& m = parsed.get_ref<const std::string&>();
        const size_t sp = m.find(' ');
        if (sp != std::string::npos && m.find(' ', sp + 1) == std::string::npos) {
          tables.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
          return false;
        }
      } else if (parsed.is_array() && parsed.size() == 2 && parsed[0].is_string() && parsed[1].is_string()) {
        tables.merges.emplace_back(parsed[0].get<std::string>(), parsed[1].get<std::string>());
        return false;
      }
      if (tables.error.empty()) {
        tables.error = "model.merges[" + std::to_string(rank) + "] must be \"a b\" or [\"a\", \"b\"]";
      }
      return false;
    }
    return true;
  };
  json tj;
  try {
    tj = json::parse(tokenizer_json, capture);
  } catch (const json::exception& e) {
    return data_loss(source + " is not valid JSON: " + e.what());
  }
  json cfg = json::object();
  if (!config_json.empty()) {
    try {
      cfg = json::parse(config_json);
    } catch (const json::exception& e) {
      return data_loss("tokenizer_config.json for " + source + " is not valid JSON: " + e.what());
    }
    if (!cfg.is_object()) return data_loss("tokenizer_config.json for " + source + " must be a JSON object");
  }
  if (!tj.is_object() || !tj.contains("model")) {
    return data_loss(source + " has no \"model\": is this a Hugging Face tokenizer.json?");
  }
  auto impl = std::make_unique<Impl>();
  impl->instance = g_next_instance.fetch_add(1);
  try {
    CEDAR_ASSIGN_OR_RETURN(impl->normalizer, make_normalizer(tj.value("normalizer", json())));
    CEDAR_ASSIGN_OR_RETURN(impl->pre_tokenizer, make_pre_tokenizer(tj.value("pre_tokenizer", json())));
    CEDAR_ASSIGN_OR_RETURN(impl->decoder, make_decoder(tj.value("decoder", json())));
    const std::string model_type = tj["model"].is_object() ? tj["model"].value("type", std::string("BPE")) : "";
    if (model_type != "BPE") {
      return unimplemented(source + ": model type '" + model_type + "' is not supported by cedar (only BPE)");
    }
    if (!tj["model"].contains("vocab") || !tj["model"]["vocab"].is_object()) {
      return data_loss(source + ": model.vocab must be an object of token -> id");
    }
    if (!tj["model"].contains("merges") || !tj["model"]["merges"].is_array()) {
      return data_loss(source + ": model.merges must be an array");
    }
    CEDAR_ASSIGN_OR_RETURN(impl->model,
                           BpeModel::from_tables(tj["model"], std::move(tables), impl->pre_tokenizer.byte_level));
  } catch (const json::exception& e) {
    return data_loss(source + ": unexpected field type: " + e.what());
  }

  impl->id_to_token = impl->model->id_to_token();
  impl->assigned.assign(impl->id_to_token.size(), 0);
  for (const auto& [tok, id] : impl->model->token_to_id()) impl->assigned[id] = 1;

  if (tj.contains("added_tokens") && !tj["added_tokens"].is_null()) {
    if (!tj["added_tokens"].is_array()) return data_loss(source + ": \"added_tokens\" must be an array");
    for (const auto& a : tj["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string()) {
        return data_loss(source + ": an added_tokens entry lacks an integer \"id\" or a string \"content\"");
      }
      AddedToken t;
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id > kMaxTokenId) return data_loss(source + ": added token id " + std::to_string(id) + " is out of range");
      t.id = static_cast<TokenId>(id);
      t.content = a["content"].get<std::string>();
      t.special = a.value("special", false);
      t.normalized = a.value("normalized", !t.special);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      if (!is_valid_utf8(t.content)) return data_loss(source + ": added token " + std::to_string(id) + " is not UTF-8");
      impl->added.push_back(std::move(t));
    }
  }
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    if (static_cast<size_t>(t.id) >= impl->id_to_token.size()) {
      impl->id_to_token.resize(t.id + 1);
      impl->assigned.resize(t.id + 1, 0);
    }
    impl->id_to_token[t.id] = t.content;
    impl->assigned[t.id] = 1;
    impl->added_to_id[t.content] = t.id;
    if (!t.normalized) {
      impl->raw_trie.insert(t.content, static_cast<int>(i));
    } else {
      // Matched in normalised text, so the pattern is the normalised content; Hugging Face also
      // reports (and decodes) such a token by its normalised form.
      std::string content = t.content;
      if (impl->normalizer) CEDAR_RETURN_IF_ERROR(impl->normalizer->apply(&content));
      impl->normalized_trie.insert(content, static_cast<int>(i));
      impl->id_to_token[t.id] = content;
    }
  }
  const size_t n = impl->id_to_token.size();
  impl->special.assign(n, 0);
  for (const auto& t : impl->added) impl->special[t.id] = t.special ? 1 : 0;
  if (impl->decoder && impl->decoder->is_byte_level()) {
    impl->token_bytes.resize(n);
    for (size_t id = 0; id < n; ++id) impl->token_bytes[id] = byte_level_token_bytes(impl->id_to_token[id]);
  }

  // BOS/EOS: tokenizer_config.json decides when it says; otherwise the post-processor template.
  auto lookup = [&](const std::string& s) -> std::optional<TokenId> {
    if (auto it = impl->added_to_id.find(s); it != impl->added_to_id.end()) return it->second;
    if (auto it = impl->model->token_to_id().find(s); it != impl->model->token_to_id().end()) return it->second;
    return std::nullopt;
  };
  if (auto b = config_token(cfg, "bos_token")) impl->bos = lookup(*b);
  if (auto e = config_token(cfg, "eos_token")) impl->eos = lookup(*e);
  if (cfg.contains("add_bos_token") || cfg.contains("add_eos_token")) {
    impl->adds_bos = cfg.value("add_bos_token", false);
    impl->adds_eos = cfg.value("add_eos_token", false);
    if (impl->adds_bos) {
      if (!impl->bos) return data_loss("tokenizer_config.json: add_bos_token is true but bos_token is missing or unknown");
      impl->prefix_ids.push_back(*impl->bos);
    }
    if (impl->adds_eos) {
      if (!impl->eos) return data_loss("tokenizer_config.json: add_eos_token is true but eos_token is missing or unknown");
      impl->suffix_ids.push_back(*impl->eos);
    }
  } else if (tj.contains("post_processor") && !tj["post_processor"].is_null()) {
    const json& pp = tj["post_processor"];
    std::vector<const json*> procs;
    if (pp.value("type", "") == "Sequence" && pp.contains("processors")) {
      for (const auto& p : pp["processors"]) procs.push_back(&p);
    } else {
      procs.push_back(&pp);
    }
    for (const json* p : procs) {
      const std::string type = p->value("type", "");
      if (type == "ByteLevel") continue;  // changes offsets only
      if (type == "TemplateProcessing") {
        bool after = false;
        for (const auto& item : p->value("single", json::array())) {
          if (item.contains("Sequence")) {
            after = true;
            continue;
          }
          if (!item.contains("SpecialToken")) continue;
          const std::string name = item["SpecialToken"].value("id", "");
          const json& st = p->value("special_tokens", json::object());
          if (!st.contains(name) || !st[name].contains("ids")) {
            return data_loss(source + ": post_processor template names special token '" + name + "' without ids");
          }
          for (const auto& id : st[name]["ids"]) (after ? impl->suffix_ids : impl->prefix_ids).push_back(id.get<TokenId>());
        }
      } else if (type == "RobertaProcessing" || type == "BertProcessing") {
        impl->prefix_ids.push_back(p->at("cls").at(1).get<TokenId>());
        impl->suffix_ids.push_back(p->at("sep").at(1).get<TokenId>());
      } else {
        return unimplemented(source + ": post_processor type '" + type + "' is not supported by cedar");
      }
    }
    impl->adds_bos = impl->bos && !impl->prefix_ids.empty() && impl->prefix_ids.front() == *impl->bos;
    impl->adds_eos = impl->eos && !impl->suffix_ids.empty() && impl->suffix_ids.back() == *impl->eos;
  }
  if (cfg.contains("clean_up_tokenization_spaces") && cfg["clean_up_tokenization_spaces"].is_boolean()) {
    impl->clean_up_spaces = cfg["clean_up_tokenization_spaces"].get<bool>();
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special) ids = impl_->prefix_ids;
  CEDAR_RETURN_IF_ERROR(impl_->encode(text, &ids));
  if (add_special) ids.insert(ids.end(), impl_->suffix_ids.begin(), impl_->suffix_ids.end());
  return ids;
}

Status Tokenizer::encode_append(std::string_view text, std::vector<TokenId>* out) const {
  return impl_->encode(text, out);
}

Status Tokenizer::encode_plain_append(std::string_view text, std::vector<TokenId>* out) const {
  return impl_->encode_without_added(text, out);
}

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  const size_t n = impl_->id_to_token.size();
  for (size_t i = 0; i < ids.size(); ++i) {
    const TokenId id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= n || !impl_->assigned[id]) {
      return invalid_argument("cannot decode id " + std::to_string(id) + " at position " + std::to_string(i) +
                              ": not in this tokenizer's vocabulary (ids 0.." + std::to_string(n - 1) + ")");
    }
  }
  std::string text;
  if (!impl_->token_bytes.empty()) {
    std::string bytes;
    for (TokenId id : ids) {
      if (skip_special && impl_->special[id]) continue;
      bytes += impl_->token_bytes[id];
    }
    text = utf8_lossy(bytes);
  } else {
    std::vector<std::string> tokens;
    for (TokenId id : ids) {
      if (skip_special && impl_->special[id]) continue;
      tokens.push_back(impl_->id_to_token[id]);
    }
    if (impl_->decoder) {
      impl_->decoder->decode_chain(&tokens);
      for (const auto& t : tokens) text += t;
    } else {
      for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
    }
  }
  if (impl_->clean_up_spaces) text = clean_up_tokenization(std::move(text));
  return text;
}

std::string Tokenizer::decode_token_raw(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size() || !impl_->assigned[id]) return "";
  if (!impl_->token_bytes.empty()) return utf8_lossy(impl_->token_bytes[id]);
  std::vector<std::string> tokens{impl_->id_to_token[id]};
  if (!impl_->decoder) return tokens[0];
  impl_->decoder->decode_chain(&tokens);
  std::string text;
  for (const auto& t : tokens) text += t;
  return text;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  if (impl_->token_bytes.empty() || id < 0 || static_cast<size_t>(id) >= impl_->token_bytes.size()) return {};
  return impl_->token_bytes[id];
}

bool Tokenizer::has_byte_level_decoder() const { return !impl_->token_bytes.empty(); }

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->added_to_id.find(key); it != impl_->added_to_id.end()) return it->second;
  if (auto it = impl_->model->token_to_id().find(key); it != impl_->model->token_to_id().end()) return it->second;
  return std::nullopt;
}

std::optional<std::string_view> Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size() || !impl_->assigned[id]) return std::nullopt;
  return std::string_view(impl_->id_to_token[id]);
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->id_to_token.size()); }
bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos; }
bool Tokenizer::adds_bos() const { return impl_->adds_bos; }
bool Tokenizer::adds_eos() const { return impl_->adds_eos; }

// ---------------------------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

Result<std::string> StreamDecoder::push(TokenId id) {
  if (!tokenizer_.id_to_token(id)) {
    return invalid_argument("cannot decode id " + std::to_string(id) + ": not in this tokenizer's vocabulary");
  }
  if (skip_special_ && tokenizer_.is_special(id)) return std::string();
  if (tokenizer_.has_byte_level_decoder()) {
    pending_bytes_ += tokenizer_.token_bytes(id);
    const size_t hold = incomplete_utf8_tail(pending_bytes_);
    std::string out = utf8_lossy(std::string_view(pending_bytes_).substr(0, pending_bytes_.size() - hold));
    pending_bytes_.erase(0, pending_bytes_.size() - hold);
    return out;
  }
  ids_.push_back(id);
  CEDAR_ASSIGN_OR_RETURN(std::string text, tokenizer_.decode(ids_, skip_special_));
  // Hold back while the text ends in a replacement character: the next id may complete it.
  if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return std::string();
  if (text.compare(0, emitted_.size(), emitted_) != 0) return std::string();
  std::string delta = text.substr(emitted_.size());
  emitted_ = std::move(text);
  return delta;
}

std::string StreamDecoder::finish() {
  if (tokenizer_.has_byte_level_decoder()) {
    std::string out = utf8_lossy(pending_bytes_);
    pending_bytes_.clear();
    return out;
  }
  auto text = tokenizer_.decode(ids_, skip_special_);
  if (!text.ok() || text->compare(0, emitted_.size(), emitted_) != 0) return std::string();
  std::string delta = text->substr(emitted_.size());
  emitted_ = std::move(*text);
  return delta;
}

}  // namespace cedar::tokenizer
