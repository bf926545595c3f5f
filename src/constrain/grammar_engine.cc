#include "constrain/grammar_engine.h"

#include <algorithm>
#include <exception>
#include <mutex>

#include <xgrammar/xgrammar.h>

#include "tokenizer/chat_encoding.h"

namespace cedar::constrain {
namespace {

// The one GrammarCompiler is shared by the server's request threads; its cache makes a repeated
// schema cost nothing, and the lock keeps the compiler single-threaded from cedar's side.
// The longest run of white space the grammars allow between JSON tokens and DSML tags: room for
// pretty-printed JSON (a newline and an indent), and a bound on the runs of white space a model
// can otherwise emit without end (xgrammar's runtime safeguard, max_whitespace_cnt).
constexpr int kMaxWhitespaceRun = 16;

std::mutex& compiler_mutex() {
  static std::mutex mu;
  return mu;
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

struct GrammarConstraint::Impl {
  Impl(const xgrammar::CompiledGrammar& grammar, int vocab_size, bool gated, int32_t think_end,
       std::shared_ptr<const SpelledMarkerTokens> spelled)
      : matcher(grammar), words(static_cast<size_t>(xgrammar::GetBitmaskSize(vocab_size))), mask(words),
        gated_at_start(gated), waiting_for_think_end(gated), think_end_id(think_end), spelled_marker(std::move(spelled)) {
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
  std::shared_ptr<const SpelledMarkerTokens> spelled_marker;  // DSML grammars only
  bool after_tag_open = false;  // the accepted text ends in "<" or "</" (DSML grammars)
  bool after_less = false;      // ... in "<"
};

GrammarConstraint::GrammarConstraint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrammarConstraint::~GrammarConstraint() = default;

const uint32_t* GrammarConstraint::next_token_mask() {
  if (impl_->waiting_for_think_end) return nullptr;
  // Fills in place: no allocation per token. false = every token allowed.
  const bool masked = impl_->matcher.FillNextTokenBitmask(&impl_->tensor);
  uint32_t* mask = reinterpret_cast<uint32_t*>(impl_->mask.data());
  const SpelledMarkerTokens* spelled = impl_->spelled_marker.get();
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
  if (impl_->waiting_for_think_end) {
    if (token == impl_->think_end_id) impl_->waiting_for_think_end = false;
    return true;
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

bool GrammarConstraint::terminated() const { return !impl_->waiting_for_think_end && impl_->matcher.IsTerminated(); }

void GrammarConstraint::reset() {
  impl_->matcher.Reset();
  impl_->waiting_for_think_end = impl_->gated_at_start;
  impl_->after_tag_open = impl_->after_less = false;
}

Result<std::unique_ptr<GrammarEngine>> GrammarEngine::create(const tokenizer::Tokenizer& tokenizer, int vocab_size) {
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
  engine->vocab_size_ = vocab_size;
  engine->eos_id_ = *eos;
  engine->think_end_id_ = tokenizer.token_to_id(tokenizer::kThinkEnd).value_or(-1);
  try {
    engine->info_ = std::make_unique<xgrammar::TokenizerInfo>(vocab, xgrammar::VocabType::RAW, vocab_size,
                                                              std::vector<int32_t>{*eos});
    // Two compile threads: the server's cores belong to the model.
    engine->compiler_ = std::make_unique<xgrammar::GrammarCompiler>(*engine->info_, /*max_threads=*/2);
  } catch (const std::exception& e) {
    return internal_error(std::string("constrained decoding: xgrammar rejected the vocabulary: ") + e.what());
  }
  return engine;
}

GrammarEngine::~GrammarEngine() = default;

Result<std::shared_ptr<const xgrammar::CompiledGrammar>> GrammarEngine::compile(const ConstraintSpec& spec) {
  std::string structural_tag;
  if (spec.kind == ConstraintKind::kToolCall || spec.kind == ConstraintKind::kToolCallRequired) {
    const bool required = spec.kind == ConstraintKind::kToolCallRequired;
    CEDAR_ASSIGN_OR_RETURN(structural_tag, dsml_tool_call_structural_tag(spec.text, required, kMaxWhitespaceRun));
  }
  std::lock_guard<std::mutex> lock(compiler_mutex());
  try {
    switch (spec.kind) {
      case ConstraintKind::kJson:
        // "" (json_object) is a JSON object or array holding any values, as a schema (xgrammar's
        // builtin JSON grammar has no white-space bound). Not any JSON value: the answer is read
        // as JSON output (serve/output_assembler.h), which starts only at `{` / `[`, so a top-level
        // `42` or `"text"` would reach the client as spaces.
        return std::make_shared<const xgrammar::CompiledGrammar>(compiler_->CompileJSONSchema(
            spec.text.empty() ? R"({"anyOf": [{"type": "object"}, {"type": "array"}]})" : spec.text,
            /*any_whitespace=*/true, std::nullopt, std::nullopt, /*strict_mode=*/spec.strict, kMaxWhitespaceRun));
      case ConstraintKind::kRegex:
        return std::make_shared<const xgrammar::CompiledGrammar>(compiler_->CompileRegex(spec.text));
      case ConstraintKind::kToolCall:
      case ConstraintKind::kToolCallRequired:
        return std::make_shared<const xgrammar::CompiledGrammar>(compiler_->CompileStructuralTag(structural_tag));
    }
  } catch (const std::exception& e) {
    return invalid_argument(std::string(e.what()));
  }
  return invalid_argument("unknown constraint kind");
}

Result<std::shared_ptr<GrammarConstraint>> GrammarEngine::start(const ConstraintSpec& spec) {
  CEDAR_ASSIGN_OR_RETURN(auto grammar, compile(spec));
  const bool gated = spec.after_think_end && think_end_id_ >= 0;
  try {
    const bool dsml = spec.kind == ConstraintKind::kToolCall || spec.kind == ConstraintKind::kToolCallRequired;
    auto impl = std::make_unique<GrammarConstraint::Impl>(*grammar, vocab_size_, gated, think_end_id_,
                                                          dsml ? spelled_marker_ : nullptr);
    return std::shared_ptr<GrammarConstraint>(new GrammarConstraint(std::move(impl)));
  } catch (const std::exception& e) {
    return internal_error(std::string("constrained decoding: ") + e.what());
  }
}

}  // namespace cedar::constrain
