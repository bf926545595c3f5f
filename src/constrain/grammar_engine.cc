#include "constrain/grammar_engine.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <new>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <xgrammar/xgrammar.h>

#include "constrain/compile_cache.h"
#include "constrain/constraint_limits.h"
#include "tokenizer/marker_tokens.h"

namespace cedar::constrain {
namespace {

// The longest run of white space the grammars allow between JSON tokens and DSML tags: room for
// pretty-printed JSON (a newline and an indent), and a bound on the runs of white space a model
// can otherwise emit without end (xgrammar's runtime safeguard, max_whitespace_cnt).
constexpr int kMaxWhitespaceRun = 16;

// The cache and singleflight key of a spec: what the compiled grammar depends on. after_think_end
// is left out on purpose: the `</think>` gate lives in the matcher (GrammarConstraint), the grammar
// is the same with or without it.
std::string cache_key(const ConstraintSpec& spec) {
  std::string key = constraint_kind_name(spec.kind);
  key += spec.strict ? "\n1\n" : "\n0\n";
  key += spec.text;
  return key;
}

std::string mib_text(int64_t bytes) {
  const int64_t tenths = (bytes * 10 + (int64_t{1} << 19)) >> 20;
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " MiB";
}

}  // namespace

const char* constraint_kind_name(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::kJson: return "json";
    case ConstraintKind::kRegex: return "regex";
    case ConstraintKind::kToolCall: return "tool_call";
    case ConstraintKind::kToolCallRequired: return "tool_call_required";
  }
  return "json";
}

// The ordinary tokens that could spell the DSML marker where a DSML grammar wants the marker token
// (xgrammar's masks work on decoded text, so they would allow them): cedar's parser, as
// deepseek-recipe's, matches the marker only against its token, and reads a spelled one as text.
// The marker is structural only right after "<" or "</" (every DSML tag begins so), so tokens that
// begin like it are refused only there: elsewhere (a string value, free text) they stay text, and
// characters such as "｜" or halfwidth katakana that only those tokens spell remain writable.
struct SpelledMarkerTokens {
  std::vector<uint32_t> starting;  // bytes begin like the marker: refused after "<" / "</" where the marker is allowed
  std::vector<uint32_t> inside;    // "<" or "/" then the marker's start within the token: always refused
  // How each token's text ends, to follow whether the accepted text ends in "<" or "</".
  enum Tail : uint8_t { kOther, kLess, kLessSlash, kSlash, kNoText };
  std::vector<uint8_t> tail;
  int32_t marker_id = -1;
};

// The tokens closing paths are made of, in the order the greedy search tries them: any text a
// grammar accepts can be spelled in single bytes, so with the DSML marker token these reach every
// completion. `0` first (the shortest JSON value, and a digit wherever one is owed), then closers
// (array, object, string and tag ends), the marker, the rest of printable ASCII, white space last.
struct ClosingAlphabet {
  std::vector<int32_t> ids;
  size_t ascii = 0;  // ids[0, ascii): ASCII bytes and the marker; the rest: other bytes (not in DSML grammars)
  std::vector<std::string> texts;  // texts[k]: the bytes of ids[k]
  std::vector<int32_t> byte_token = std::vector<int32_t>(256, -1);  // the token of each single byte
  int32_t marker_id = -1;
  size_t preferred = 0;  // ids[0, preferred): `0`, the closers and the marker, all tried at every step
  std::vector<uint16_t> token_bytes;  // [vocab]: how many bytes each token's text has
  // Text a grammar forces (tag names, property keys) is spelled with the longest ordinary tokens
  // that fit, as the model itself would write it, not byte by byte: a DSML call's forced tags are
  // ~40 bytes but ~15 tokens, and a closing path counted in bytes overstated what a small
  // max_tokens needs (forced tool calls came out partial below ~110 tokens). ASCII tokens only
  // (none of them can spell the DSML marker).
  std::unordered_map<std::string, int32_t> ascii_tokens;  // 2..kLongestForcedToken bytes
};

constexpr size_t kLongestForcedToken = 16;

struct GrammarConstraint::Impl {
  Impl(const xgrammar::CompiledGrammar& grammar, int vocab_size, bool gated, int32_t think_end, int32_t eos,
       std::shared_ptr<const std::vector<uint32_t>> reasoning, std::shared_ptr<const SpelledMarkerTokens> spelled,
       std::shared_ptr<const ClosingAlphabet> alphabet)
      : matcher(grammar), words(static_cast<size_t>(xgrammar::GetBitmaskSize(vocab_size))), mask(words),
        gated_at_start(gated), waiting_for_think_end(gated), think_end_id(think_end), reasoning_mask(std::move(reasoning)),
        spelled_marker(std::move(spelled)), narrowed(words), eos_id(eos), closing(std::move(alphabet)) {
    shape = static_cast<int64_t>(words);
    tensor.data = mask.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = 1;
    tensor.dtype = xgrammar::GetBitmaskDLType();
    tensor.shape = &shape;
    tensor.strides = nullptr;
    tensor.byte_offset = 0;
  }
  xgrammar::GrammarMatcher matcher;
  size_t words;
  std::vector<int32_t> mask;  // xgrammar's bitmask layout: int32 words, bit i % 32 of word i / 32
  int64_t shape = 0;
  DLTensor tensor{};
  bool gated_at_start;
  bool waiting_for_think_end;  // thinking mode: the reasoning before </think> is free
  int32_t think_end_id;
  // The reasoning's mask: every token but the end of sentence and, in DSML grammars, the marker.
  std::shared_ptr<const std::vector<uint32_t>> reasoning_mask;
  std::shared_ptr<const SpelledMarkerTokens> spelled_marker;  // DSML grammars only
  bool after_tag_open = false;  // the accepted text ends in "<" or "</" (DSML grammars)
  bool after_less = false;      // ... in "<"

  // Budget-aware closing (mask_to_finish_within).
  std::vector<uint32_t> narrowed;               // the narrower mask it returns
  bool last_mask_all = true;                    // the last next_token_mask() allowed every token
  int32_t eos_id;
  std::shared_ptr<const ClosingAlphabet> closing;
  std::vector<int32_t> path;                    // a closing path from the matcher's state, when path_current
  bool path_current = false;
  int32_t approved_token = -1;                  // the token last approved, and the closing path after it
  std::vector<int32_t> approved_path;
  int start_closing = -2;                       // closing length from the grammar's start; -2: not computed
  std::unordered_set<std::string> seen;         // grammar states on the path being searched
  std::unordered_set<std::string> seen_shapes;  // ... and their shapes (shape_of)
  std::unordered_map<std::string, int> lengths; // closing length by state, while narrowing
  // The last find_closing() stopped at kMaxClosingTokens; once a search from the output's own state
  // does (not one after a candidate token), closing is off for the request: such a grammar (`(a{1000}){1000}`: a million bytes to
  // complete) would pay two failing 512-step searches per token, ~170 ms each, on the engine's
  // thread, for nothing.
  bool hit_cap = false;
  bool closing_off = false;

  bool allowed(int32_t id) const {
    if (last_mask_all) return true;
    const uint32_t* m = reinterpret_cast<const uint32_t*>(mask.data());
    return id >= 0 && static_cast<size_t>(id) < words * 32 && ((m[id / 32] >> (id % 32)) & 1u);
  }

  // The matcher's state as text: the parser states of its last step, each rule's start written as
  // the distance back from the current position. Equal keys on one path of accepted tokens are the
  // same point of the grammar: a loop (a rule that repeats by recursion restarts at each character,
  // so only relative starts show that it came back to where it was).
  std::string state_key() const {
    const std::string text = matcher._DebugPrintInternalState();
    // "There are N steps in history. Last step: [ ... rule_start_pos=P, ... ]"
    static constexpr std::string_view kSteps = "There are ", kField = "rule_start_pos=";
    const long now = text.starts_with(kSteps) ? std::strtol(text.c_str() + kSteps.size(), nullptr, 10) : 0;
    const size_t body = text.find("Last step");
    std::string key;
    key.reserve(text.size());
    size_t from = body == std::string::npos ? 0 : body;
    for (size_t at = text.find(kField, from); at != std::string::npos; at = text.find(kField, from)) {
      at += kField.size();
      key.append(text, from, at - from);
      char* end = nullptr;
      const long pos = std::strtol(text.c_str() + at, &end, 10);
      key += std::to_string(pos < 0 ? pos : now - pos);
      from = static_cast<size_t>(end - text.c_str());
    }
    key.append(text, from, std::string::npos);
    return key;
  }

  // How far back the oldest rule of a state key began (its largest relative start; a rule of the
  // root, start -1, counts as the oldest of all). A step that makes it grow by more than the bytes
  // it took has closed a rule (a string, an array, a tag): the state is back in a rule that began
  // earlier than those it left.
  static long oldest_rule_age(const std::string& key) {
    static constexpr std::string_view kField = "rule_start_pos=";
    static constexpr long kRoot = 1L << 40;
    long oldest = -1;
    for (size_t at = key.find(kField); at != std::string::npos; at = key.find(kField, at + 1)) {
      const long age = std::strtol(key.c_str() + at + kField.size(), nullptr, 10);
      oldest = std::max(oldest, age < 0 ? kRoot : age);
    }
    return oldest;
  }

  // Whether `after` is the state `before` moved on by `bytes` bytes inside the same rules: the same
  // parser states, each begun `bytes` earlier relative to the new position (the root's -1 as it
  // was). Then nothing was opened or closed (characters of a string or of free text) and the same
  // closing path completes the output.
  static bool same_rules_aged(const std::string& before, const std::string& after, long bytes) {
    static constexpr std::string_view kField = "rule_start_pos=";
    size_t a = 0, b = 0;
    for (;;) {
      const size_t fa = before.find(kField, a), fb = after.find(kField, b);
      if ((fa == std::string::npos) != (fb == std::string::npos)) return false;
      if (fa == std::string::npos) return before.compare(a, std::string::npos, after, b, std::string::npos) == 0;
      if (fa - a != fb - b || before.compare(a, fa - a, after, b, fb - b) != 0) return false;
      char *ea = nullptr, *eb = nullptr;
      const long pa = std::strtol(before.c_str() + fa + kField.size(), &ea, 10);
      const long pb = std::strtol(after.c_str() + fb + kField.size(), &eb, 10);
      if (pa < 0 ? pb != pa : pb != pa + bytes) return false;
      a = static_cast<size_t>(ea - before.c_str());
      b = static_cast<size_t>(eb - after.c_str());
    }
  }

  // The key without the rules' starts: where in the grammar the state is, not since when. Steps
  // that come back to a shape (characters of a string or of free text) make no progress.
  static std::string shape_of(const std::string& key) {
    static constexpr std::string_view kField = "rule_start_pos=";
    std::string shape;
    size_t from = 0;
    for (size_t at = key.find(kField); at != std::string::npos; at = key.find(kField, from)) {
      shape.append(key, from, at - from);
      from = key.find(',', at);
      if (from == std::string::npos) from = key.size();
    }
    shape.append(key, from, std::string::npos);
    return shape;
  }

  // A closing path from the matcher's state (token ids; the matcher takes their text). Forced text
  // is taken whole. Otherwise each step tries the alphabet in order and takes the first token that
  // completes the output or closes a rule (oldest_rule_age grows by more than the token's bytes);
  // when none does, the first that leads to a shape not yet on the path (so two characters of a
  // string never alternate for ever), else to a state not yet on it of another shape than this
  // one, else to any state not yet on it. Beyond the preferred tokens the scan stops at the first
  // step to a new shape (a closer among letters is rare; trying them all was most of the cost). Leaves the matcher as it was. false when the output
  // cannot be completed this way within kMaxClosingTokens.
  bool find_closing(std::vector<int32_t>* out) {
    out->clear();
    seen.clear();
    seen_shapes.clear();
    std::string key = state_key();
    seen.insert(key);
    const size_t n = spelled_marker ? closing->ascii : closing->ids.size();
    bool found = true;
    hit_cap = false;
    int steps = 0;  // matcher steps taken (forced text is one step for many tokens)
    while (!matcher.IsCompleted()) {
      if (out->size() >= static_cast<size_t>(kMaxClosingTokens)) {
        found = false;
        hit_cap = true;
        break;
      }
      if (take_forced_text(out)) {
        ++steps;
        key = state_key();
        continue;
      }
      if (hit_cap) {  // the forced text alone passes kMaxClosingTokens
        found = false;
        break;
      }
      const long age = oldest_rule_age(key);
      const std::string shape = shape_of(key);
      seen_shapes.insert(shape);
      size_t fallback = n, elsewhere = n, self_loop = n;
      bool closed = false;
      for (size_t k = 0; k < n && !closed; ++k) {
        // AcceptString: the same step for these tokens, without AcceptToken's search of the special ids.
        if (!matcher.AcceptString(closing->texts[k])) continue;
        std::string next = state_key();
        if (!seen.contains(next)) {
          // A token that closes a rule only with the text it forces (the marker of a closing tag,
          // then " parameter>") is a closer too: look through that text.
          const std::string forced = matcher.IsCompleted() ? std::string() : matcher.FindJumpForwardString();
          const bool through = !forced.empty() && matcher.AcceptString(forced);
          const long grew = static_cast<long>(closing->texts[k].size() + (through ? forced.size() : 0));
          const bool closes = matcher.IsCompleted() || (age >= 0 && oldest_rule_age(through ? state_key() : next) > age + grew);
          if (through) matcher.Rollback(1);
          if (closes) {
            closed = true;
            ++steps;
            out->push_back(closing->ids[k]);
            seen.insert(next);
            key = std::move(next);
            break;
          }
          const std::string next_shape = shape_of(next);
          if (fallback == n && !seen_shapes.contains(next_shape)) fallback = k;
          if (elsewhere == n && next_shape != shape) elsewhere = k;
          if (self_loop == n) self_loop = k;
        }
        matcher.Rollback(1);
        // Past the preferred tokens (closers first), the first step to a new shape is taken.
        if (k + 1 >= closing->preferred && fallback != n) break;
      }
      if (closed) continue;
      if (fallback == n) fallback = elsewhere != n ? elsewhere : self_loop;
      if (fallback == n || !matcher.AcceptString(closing->texts[fallback])) {
        found = false;
        break;
      }
      ++steps;
      out->push_back(closing->ids[fallback]);
      key = state_key();
      seen.insert(key);
    }
    if (steps > 0) matcher.Rollback(steps);
    return found;
  }

  // Takes the text the grammar forces next (xgrammar's jump-forward string) in one matcher step,
  // appending it as single-byte tokens and the marker token where it spells the marker. false when
  // nothing is forced (or it would pass kMaxClosingTokens).
  bool take_forced_text(std::vector<int32_t>* out) {
    const std::string forced = matcher.FindJumpForwardString();
    if (forced.empty()) return false;
    const std::string_view marker = tokenizer::kDsml;
    const size_t start = out->size();
    for (size_t i = 0; i < forced.size();) {
      const bool is_marker = closing->marker_id >= 0 && std::string_view(forced).substr(i).starts_with(marker);
      int32_t id = is_marker ? closing->marker_id : closing->byte_token[static_cast<uint8_t>(forced[i])];
      size_t taken = is_marker ? marker.size() : 1;
      if (!is_marker) {
        // The longest ordinary token spelling the text from here, not across a marker.
        size_t limit = std::min(kLongestForcedToken, forced.size() - i);
        if (const size_t m = closing->marker_id >= 0 ? forced.find(marker, i) : std::string::npos; m != std::string::npos)
          limit = std::min(limit, m - i);
        for (size_t len = limit; len >= 2; --len) {
          auto it = closing->ascii_tokens.find(forced.substr(i, len));
          if (it != closing->ascii_tokens.end()) {
            id = it->second;
            taken = len;
            break;
          }
        }
      }
      if (id < 0 || out->size() >= static_cast<size_t>(kMaxClosingTokens)) {
        hit_cap = id >= 0;
        out->resize(start);
        return false;
      }
      out->push_back(id);
      i += taken;
    }
    if (!matcher.AcceptString(forced)) {
      out->resize(start);
      return false;
    }
    return true;
  }

  // The tokens of the alphabet the last mask allowed after which the output can be completed
  // within `left_after` tokens (and the end of sentence where the output is complete already).
  const uint32_t* narrow_to_closable(int left_after) {
    std::fill(narrowed.begin(), narrowed.end(), 0u);
    bool any = false;
    auto set = [&](int32_t id) {
      narrowed[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
      any = true;
    };
    if (matcher.IsCompleted() && allowed(eos_id)) set(eos_id);
    lengths.clear();
    const size_t n = spelled_marker ? closing->ascii : closing->ids.size();
    std::vector<int32_t> scratch;
    for (size_t k = 0; k < n; ++k) {
      const int32_t id = closing->ids[k];
      if (!allowed(id) || !matcher.AcceptString(closing->texts[k])) continue;
      auto [it, inserted] = lengths.try_emplace(state_key(), -1);
      if (inserted) it->second = find_closing(&scratch) ? static_cast<int>(scratch.size()) : -1;
      matcher.Rollback(1);
      // The first token of the closing path from here leaves the rest of it, whatever a search
      // from after that token finds.
      if (path_current && !path.empty() && path.front() == id) {
        const int rest = static_cast<int>(path.size()) - 1;
        if (it->second < 0 || rest < it->second) it->second = rest;
      }
      if (it->second >= 0 && it->second <= left_after) set(id);
    }
    // The closing path's first token may be a longer one (forced text): it fits by construction.
    if (path_current && !path.empty() && allowed(path.front()) && static_cast<int>(path.size()) - 1 <= left_after)
      set(path.front());
    return any ? narrowed.data() : nullptr;
  }
};

GrammarConstraint::GrammarConstraint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrammarConstraint::~GrammarConstraint() = default;

const uint32_t* GrammarConstraint::next_token_mask() {
  impl_->last_mask_all = true;
  if (impl_->waiting_for_think_end) return impl_->reasoning_mask->data();
  // Fills in place: no allocation per token. false = every token allowed.
  const bool masked = impl_->matcher.FillNextTokenBitmask(&impl_->tensor);
  uint32_t* mask = reinterpret_cast<uint32_t*>(impl_->mask.data());
  const SpelledMarkerTokens* spelled = impl_->spelled_marker.get();
  impl_->last_mask_all = !masked && !spelled;
  if (!spelled) return masked ? mask : nullptr;
  if (!masked) std::fill(impl_->mask.begin(), impl_->mask.end(), -1);
  const int64_t m = spelled->marker_id;
  const bool marker_allowed = m >= 0 && static_cast<size_t>(m) < impl_->words * 32 && ((mask[m / 32] >> (m % 32)) & 1u);
  const bool refuse_starting = marker_allowed && impl_->after_tag_open;
  for (size_t w = 0; w < impl_->words && w < spelled->inside.size(); ++w) {
    mask[w] &= ~spelled->inside[w];
    if (refuse_starting) mask[w] &= ~spelled->starting[w];
  }
  return mask;
}

bool GrammarConstraint::accept_token(int32_t token) {
  // The closing path approved with this token (mask_to_finish_within) now starts at the new state.
  impl_->path_current = token == impl_->approved_token;
  if (impl_->path_current) {
    impl_->path.swap(impl_->approved_path);
  }
  impl_->approved_token = -1;
  if (impl_->waiting_for_think_end) {
    if (token == impl_->think_end_id) impl_->waiting_for_think_end = false;
    const std::vector<uint32_t>& reasoning = *impl_->reasoning_mask;
    return token >= 0 && static_cast<size_t>(token) / 32 < reasoning.size() &&
           ((reasoning[static_cast<size_t>(token) / 32] >> (token % 32)) & 1u);
  }
  if (!impl_->matcher.AcceptToken(token)) return false;
  if (const SpelledMarkerTokens* spelled = impl_->spelled_marker.get();
      spelled && token >= 0 && static_cast<size_t>(token) < spelled->tail.size()) {
    using T = SpelledMarkerTokens;
    switch (spelled->tail[static_cast<size_t>(token)]) {
      case T::kLess: impl_->after_tag_open = impl_->after_less = true; break;
      case T::kLessSlash: impl_->after_tag_open = true, impl_->after_less = false; break;
      case T::kSlash: impl_->after_tag_open = impl_->after_less, impl_->after_less = false; break;
      case T::kNoText: break;
      default: impl_->after_tag_open = impl_->after_less = false; break;
    }
  }
  return true;
}

const uint32_t* GrammarConstraint::mask_to_finish_within(int32_t token, int tokens_left_after) {
  Impl& s = *impl_;
  s.approved_token = -1;
  // Far from the end no closing path the search could find is too long.
  if (tokens_left_after >= kMaxClosingTokens || token == s.eos_id) return nullptr;
  if (s.waiting_for_think_end) {
    // The reasoning is free, but must leave the answer room: `</think>`, then a closing path from
    // the grammar's start.
    if (s.start_closing == -2) {
      std::vector<int32_t> scratch;
      s.start_closing = s.find_closing(&scratch) ? static_cast<int>(scratch.size()) : -1;
    }
    if (s.start_closing < 0 || token == s.think_end_id || s.think_end_id < 0 ||
        s.start_closing + 1 <= tokens_left_after)
      return nullptr;
    std::fill(s.narrowed.begin(), s.narrowed.end(), 0u);
    s.narrowed[static_cast<size_t>(s.think_end_id) / 32] |= 1u << (s.think_end_id % 32);
    return s.narrowed.data();
  }
  if (s.matcher.IsTerminated() || s.closing_off) return nullptr;
  int after = -1;
  if (s.path_current && !s.path.empty() && s.path.front() == token) {
    // The token starts the closing path already known: the rest of it follows.
    s.approved_path.assign(s.path.begin() + 1, s.path.end());
    after = static_cast<int>(s.approved_path.size());
  } else {
    const std::string before = s.path_current ? s.state_key() : std::string();
    if (!s.matcher.AcceptToken(token)) return nullptr;  // accept_token() reports it
    const size_t bytes = static_cast<size_t>(token) < s.closing->token_bytes.size() ? s.closing->token_bytes[token] : 0;
    if (s.path_current && bytes > 0 && s.same_rules_aged(before, s.state_key(), static_cast<long>(bytes))) {
      // Content inside the rules of the known closing path (most tokens of a string value): the path
      // holds, without a search.
      s.approved_path.assign(s.path.begin(), s.path.end());
      after = static_cast<int>(s.approved_path.size());
    } else if (s.find_closing(&s.approved_path)) {
      after = static_cast<int>(s.approved_path.size());
    }
    s.matcher.Rollback(1);
  }
  if (after >= 0 && after <= tokens_left_after) {
    s.approved_token = token;
    return nullptr;
  }
  // Narrowing helps only when the closing path from here, less its first token, still fits; else
  // (max_tokens below the shortest output the grammar allows, or a path too long to find) the
  // output is cut as it would be without closing, and the search over the alphabet is spared.
  int current = -1;
  if (s.path_current) {
    current = static_cast<int>(s.path.size());
  } else if (s.find_closing(&s.path)) {
    s.path_current = true;
    current = static_cast<int>(s.path.size());
  } else if (s.hit_cap) {
    s.closing_off = true;
  }
  if (current < 0 || current - 1 > tokens_left_after) return nullptr;
  const uint32_t* narrowed = s.narrow_to_closable(tokens_left_after);
  // Should the engine pick the closing path's first token, the rest of the path goes on with it
  // (a search from after that token alone may find a longer one).
  if (!s.path.empty()) {
    s.approved_token = s.path.front();
    s.approved_path.assign(s.path.begin() + 1, s.path.end());
  }
  return narrowed;
}

int GrammarConstraint::tokens_to_complete() {
  Impl& s = *impl_;
  if (s.start_closing == -2) {
    std::vector<int32_t> scratch;
    s.start_closing = s.find_closing(&scratch) ? static_cast<int>(scratch.size()) : -1;
  }
  if (s.start_closing < 0) return -1;
  return s.start_closing + (s.gated_at_start ? 1 : 0);
}

bool GrammarConstraint::terminated() const { return !impl_->waiting_for_think_end && impl_->matcher.IsTerminated(); }

void GrammarConstraint::reset() {
  impl_->matcher.Reset();
  impl_->waiting_for_think_end = impl_->gated_at_start;
  impl_->after_tag_open = impl_->after_less = false;
  impl_->path_current = false;
  impl_->closing_off = false;
  impl_->approved_token = -1;
}

Result<std::unique_ptr<GrammarEngine>> GrammarEngine::create(const tokenizer::Tokenizer& tokenizer, int vocab_size,
                                                             GrammarEngineOptions options) {
  if (!tokenizer.has_byte_level_decoder())
    return failed_precondition("constrained decoding needs a byte-level BPE tokenizer (DeepSeek's)");
  const std::optional<tokenizer::TokenId> eos = tokenizer.token_to_id(tokenizer::kEos);
  if (!eos) return failed_precondition("constrained decoding: the tokenizer has no <｜end▁of▁sentence｜> token");
  const int n = std::min(tokenizer.vocab_size(), vocab_size);
  std::vector<std::string> vocab(static_cast<size_t>(n));
  for (int id = 0; id < n; ++id) vocab[static_cast<size_t>(id)] = std::string(tokenizer.token_bytes(id));
  // Added tokens are control markers: "" makes xgrammar treat them as special (never allowed), except
  // the ones a constrained output may hold (see the header). The stop token is named below.
  for (const tokenizer::AddedToken& t : tokenizer.added_tokens()) {
    if (t.id < 0 || t.id >= n) continue;
    vocab[static_cast<size_t>(t.id)] = t.content == tokenizer::kDsml ? t.content : std::string();
  }
  auto engine = std::unique_ptr<GrammarEngine>(new GrammarEngine());
  {
    // Which ordinary tokens could spell the DSML marker (SpelledMarkerTokens).
    const std::string_view marker = tokenizer::kDsml;
    auto spelled = std::make_shared<SpelledMarkerTokens>();
    const size_t words = static_cast<size_t>(xgrammar::GetBitmaskSize(vocab_size));
    spelled->starting.assign(words, 0);
    spelled->inside.assign(words, 0);
    spelled->marker_id = tokenizer.token_to_id(marker).value_or(-1);
    spelled->tail.assign(static_cast<size_t>(n), SpelledMarkerTokens::kNoText);
    // `s` (non-empty) is where the marker would begin: the marker starts with it, or it with the marker.
    auto begins_marker = [&](std::string_view s) { return marker.starts_with(s) || s.starts_with(marker); };
    for (int id = 0; id < n; ++id) {
      const std::string_view bytes = vocab[static_cast<size_t>(id)];
      using T = SpelledMarkerTokens;
      spelled->tail[static_cast<size_t>(id)] = bytes.empty()             ? T::kNoText
                                               : bytes.ends_with("</")    ? T::kLessSlash
                                               : bytes.ends_with("<")     ? T::kLess
                                               : bytes == "/"             ? T::kSlash
                                                                          : T::kOther;
      if (bytes.empty() || bytes == marker) continue;  // added tokens (the marker's own included)
      const uint32_t bit = 1u << (id % 32);
      if (begins_marker(bytes)) spelled->starting[static_cast<size_t>(id) / 32] |= bit;
      for (size_t i = 1; i < bytes.size(); ++i) {
        if ((bytes[i - 1] == '<' || bytes[i - 1] == '/') && begins_marker(bytes.substr(i))) {
          spelled->inside[static_cast<size_t>(id) / 32] |= bit;
          break;
        }
      }
    }
    engine->spelled_marker_ = std::move(spelled);
  }
  {
    // The closing alphabet: the single-byte tokens in ClosingAlphabet's order, and the marker.
    std::vector<int32_t> byte_token(256, -1);
    for (int id = 0; id < n; ++id) {
      const std::string& bytes = vocab[static_cast<size_t>(id)];
      if (bytes.size() == 1 && byte_token[static_cast<uint8_t>(bytes[0])] < 0) byte_token[static_cast<uint8_t>(bytes[0])] = id;
    }
    auto alphabet = std::make_shared<ClosingAlphabet>();
    alphabet->byte_token = byte_token;
    alphabet->token_bytes.resize(static_cast<size_t>(n));
    for (int id = 0; id < n; ++id)
      alphabet->token_bytes[static_cast<size_t>(id)] =
          static_cast<uint16_t>(std::min<size_t>(vocab[static_cast<size_t>(id)].size(), 0xFFFF));
    std::vector<bool> placed(256, false);
    auto add = [&](unsigned char c) {
      if (placed[c] || byte_token[c] < 0) return;
      placed[c] = true;
      alphabet->ids.push_back(byte_token[c]);
      alphabet->texts.push_back(std::string(1, static_cast<char>(c)));
    };
    add('0');
    for (unsigned char c : std::string_view("]}\"></")) add(c);
    if (const std::optional<tokenizer::TokenId> marker = tokenizer.token_to_id(tokenizer::kDsml); marker && *marker < n) {
      alphabet->ids.push_back(*marker);
      alphabet->texts.push_back(std::string(tokenizer::kDsml));
      alphabet->marker_id = *marker;
    }
    alphabet->preferred = alphabet->ids.size();
    for (int c = 0x21; c < 0x7f; ++c) add(static_cast<unsigned char>(c));
    for (unsigned char c : std::string_view("\n \t\r")) add(c);
    alphabet->ascii = alphabet->ids.size();
    for (int c = 0; c < 256; ++c) add(static_cast<unsigned char>(c));
    for (int id = 0; id < n; ++id) {
      const std::string& bytes = vocab[static_cast<size_t>(id)];
      if (bytes.size() < 2 || bytes.size() > kLongestForcedToken) continue;
      if (std::all_of(bytes.begin(), bytes.end(), [](char c) { return c == '\n' || (c >= 0x20 && c < 0x7f); }))
        alphabet->ascii_tokens.emplace(bytes, id);
    }
    engine->closing_ = std::move(alphabet);
  }
  engine->vocab_size_ = vocab_size;
  engine->eos_id_ = *eos;
  engine->think_end_id_ = tokenizer.token_to_id(tokenizer::kThinkEnd).value_or(-1);
  {
    // The reasoning before `</think>` is free, but it cannot end the turn (the answer the grammar
    // constrains must follow) and, under a tool grammar, cannot open a calls block: deepseek-recipe
    // reads a `<｜DSML｜` in the reasoning as the start of the calls, which would bypass the tools'
    // schemas. xgrammar's own reasoning tags allow neither (its text excludes stop and added tokens).
    const size_t words = static_cast<size_t>(xgrammar::GetBitmaskSize(vocab_size));
    auto clear = [](std::vector<uint32_t>& mask, int32_t id) {
      if (id >= 0 && static_cast<size_t>(id) / 32 < mask.size()) mask[static_cast<size_t>(id) / 32] &= ~(1u << (id % 32));
    };
    std::vector<uint32_t> reasoning(words, 0xFFFFFFFFu);
    clear(reasoning, *eos);
    std::vector<uint32_t> reasoning_dsml = reasoning;
    clear(reasoning_dsml, tokenizer.token_to_id(tokenizer::kDsml).value_or(-1));
    engine->reasoning_mask_ = std::make_shared<const std::vector<uint32_t>>(std::move(reasoning));
    engine->reasoning_mask_dsml_ = std::make_shared<const std::vector<uint32_t>>(std::move(reasoning_dsml));
  }
  engine->cache_ = std::make_unique<CompiledGrammarCache>(std::max<int64_t>(0, options.cache_bytes));
  engine->max_grammar_bytes_ =
      options.max_grammar_bytes > 0 ? options.max_grammar_bytes : std::max<int64_t>(1, options.cache_bytes / 4);
  try {
    engine->info_ = std::make_unique<xgrammar::TokenizerInfo>(vocab, xgrammar::VocabType::RAW, vocab_size,
                                                              std::vector<int32_t>{*eos});
    // The compile threads, each with its own compiler: no lock is shared between compilations.
    engine->executor_ = std::make_unique<CompileExecutor>(*engine->info_, options.compile);
  } catch (const std::exception& e) {
    return internal_error(std::string("constrained decoding: xgrammar rejected the vocabulary: ") + e.what());
  }
  return engine;
}

GrammarEngine::~GrammarEngine() = default;

int64_t GrammarEngine::cache_bytes() const { return cache_->bytes(); }
size_t GrammarEngine::cache_entries() const { return cache_->entries(); }

Result<std::shared_ptr<const xgrammar::CompiledGrammar>> GrammarEngine::compile(const ConstraintSpec& spec,
                                                                                const std::function<bool()>& cancelled) {
  std::string key = cache_key(spec);
  if (std::shared_ptr<const xgrammar::CompiledGrammar> cached = cache_->find(key)) return cached;
  std::string structural_tag;
  if (spec.kind == ConstraintKind::kToolCall || spec.kind == ConstraintKind::kToolCallRequired) {
    const bool required = spec.kind == ConstraintKind::kToolCallRequired;
    CEDAR_ASSIGN_OR_RETURN(structural_tag, dsml_tool_call_structural_tag(spec.text, required, kMaxWhitespaceRun));
  }
  // Runs on a compile thread, with that thread's compiler (CompileExecutor); the result goes to the
  // cache even when the requester stopped waiting, so a retry finds it.
  auto job = [this, spec, key, tag = std::move(structural_tag)](
                 xgrammar::GrammarCompiler& compiler) -> Result<std::shared_ptr<const xgrammar::CompiledGrammar>> {
    std::optional<xgrammar::CompiledGrammar> grammar;
    try {
      switch (spec.kind) {
        case ConstraintKind::kJson:
          // "" (json_object) is a JSON object or array holding any values, as a schema (xgrammar's
          // builtin JSON grammar has no white-space bound). Not any JSON value: the answer is read
          // as JSON output (serve/output_assembler.h), which starts only at `{` / `[`, so a top-level
          // `42` or `"text"` would reach the client as spaces.
          grammar.emplace(compiler.CompileJSONSchema(
              spec.text.empty() ? R"({"anyOf": [{"type": "object"}, {"type": "array"}]})" : spec.text,
              /*any_whitespace=*/true, std::nullopt, std::nullopt, /*strict_mode=*/spec.strict, kMaxWhitespaceRun));
          break;
        case ConstraintKind::kRegex: grammar.emplace(compiler.CompileRegex(spec.text)); break;
        case ConstraintKind::kToolCall:
        case ConstraintKind::kToolCallRequired: grammar.emplace(compiler.CompileStructuralTag(tag)); break;
      }
    } catch (const std::bad_alloc&) {
      return invalid_argument("the constraint needs more memory to compile than this server can give it");
    } catch (const std::length_error&) {
      return invalid_argument("the constraint needs more memory to compile than this server can give it");
    } catch (const std::exception& e) {
      return invalid_argument(sanitize_grammar_error(e.what()));  // the reason, without xgrammar's paths and times
    }
    if (!grammar) return invalid_argument("unknown constraint kind");
    const int64_t bytes = static_cast<int64_t>(grammar->MemorySizeBytes());
    if (bytes > max_grammar_bytes_)
      return invalid_argument("the compiled constraint takes " + mib_text(bytes) + ", over the " +
                              mib_text(max_grammar_bytes_) +
                              " this server allows per constraint (a quarter of --grammar-cache); use a smaller "
                              "schema or pattern");
    auto shared = std::make_shared<const xgrammar::CompiledGrammar>(std::move(*grammar));
    // Charged at 1.5x: MemorySizeBytes counts the elements, not the containers' and allocator's
    // overhead (RSS grew ~1.2x the sum over a thousand schemas), and the budget bounds the RSS.
    cache_->insert(key, shared, bytes + bytes / 2);
    return shared;
  };
  return executor_->run(key, job, cancelled);
}

Result<std::shared_ptr<GrammarConstraint>> GrammarEngine::start(const ConstraintSpec& spec,
                                                                const std::function<bool()>& cancelled) {
  CEDAR_RETURN_IF_ERROR(check_constraint(spec, ""));  // limits and keywords before any compilation work
  CEDAR_ASSIGN_OR_RETURN(auto grammar, compile(spec, cancelled));
  const bool gated = spec.after_think_end && think_end_id_ >= 0;
  try {
    const bool dsml = spec.kind == ConstraintKind::kToolCall || spec.kind == ConstraintKind::kToolCallRequired;
    auto impl = std::make_unique<GrammarConstraint::Impl>(*grammar, vocab_size_, gated, think_end_id_, eos_id_,
                                                          dsml ? reasoning_mask_dsml_ : reasoning_mask_,
                                                          dsml ? spelled_marker_ : nullptr, closing_);
    return std::shared_ptr<GrammarConstraint>(new GrammarConstraint(std::move(impl)));
  } catch (const std::bad_alloc&) {
    return resource_exhausted("constrained decoding: out of memory starting the grammar matcher");
  } catch (const std::exception& e) {
    return internal_error("constrained decoding: " + sanitize_grammar_error(e.what()));
  }
}

}  // namespace cedar::constrain
