// Constrained decoding over xgrammar's C++ core (cmake/Xgrammar.cmake: the pinned 0.2.9 sdist).
//
// GrammarEngine is built once per server from the tokenizer: it tells xgrammar the bytes of every
// token and compiles the output constraints deepseek-recipe derives from a request (json, regex,
// tool_call, tool_call_required; see ConstraintSpec) into grammars, caching them. start() gives a
// fresh per-request GrammarConstraint, the runtime::TokenConstraint the engine masks the logits
// with. Compilations run on CompileExecutor's threads (deadline, singleflight, bounded queue) and
// their results live in a byte-bounded LRU, CompiledGrammarCache (docs/SERVER.md, "Compilation and
// the grammar cache").
//
// Token bytes: ordinary tokens are their byte-level bytes. Added tokens are never allowed inside a
// constrained span (xgrammar treats an empty token as special), except the end-of-sentence token,
// which ends the output once the grammar is complete, and the DSML marker token, which the model
// writes inside its tool-call blocks (it matches its own bytes, "｜DSML｜", where the grammar wants
// them).
//
// Thinking mode: the grammar starts after the `</think>` token (ConstraintSpec::after_think_end), as
// xgrammar's own DeepSeek structural tag does. The reasoning before it is free text: any token but
// the end of sentence (the constrained answer must follow) and, under a tool grammar, the DSML marker
// (a calls block opened in the reasoning would escape the tools' schemas).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "constrain/compile_executor.h"
#include "core/status.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"

namespace cedar::constrain {

// The kinds of deepseek-recipe's OutputConstraint.
enum class ConstraintKind {
  kJson,              // `text`: a JSON schema, or "" for any JSON object or array (json_object)
  kRegex,             // `text`: a regular expression the whole output matches
  kToolCall,          // `text`: the tools; free text, then optionally one DSML calls block
  kToolCallRequired,  // `text`: the tools; the prompt ends inside "<｜DSML｜ calls>\n": one or more
                      // invokes of those tools, then the block's end
};
const char* constraint_kind_name(ConstraintKind kind);  // "json", "regex", "tool_call", ...

struct ConstraintSpec {
  ConstraintKind kind = ConstraintKind::kJson;
  // json: the schema text ("" = any object or array); regex: the pattern; tool kinds: a JSON array of
  // function objects {"name": ..., "parameters": {...}} (parameters absent or null: any arguments).
  std::string text;
  // json only: reject properties the schema does not declare (the schema is already in strict
  // form; xgrammar's strict_mode). Off: unknown properties are allowed, as JSON Schema says.
  bool strict = false;
  // The grammar applies after the `</think>` token; before it every token is allowed but the end of
  // sentence and, for the tool kinds, the DSML marker.
  bool after_think_end = false;
};

class GrammarEngine;
class CompiledGrammarCache;
struct SpelledMarkerTokens;
struct ClosingAlphabet;

// How far before max_tokens budget-aware closing looks, and the longest closing path it searches
// for: an output whose shortest completion is longer is cut by max_tokens as without it.
inline constexpr int kMaxClosingTokens = 512;

// One request's matcher: the runtime::TokenConstraint of constrained decoding.
class GrammarConstraint final : public runtime::TokenConstraint {
 public:
  ~GrammarConstraint() override;
  const uint32_t* next_token_mask() override;
  bool accept_token(int32_t token) override;
  // Budget-aware closing (runtime::TokenConstraint): within the last kMaxClosingTokens of the
  // budget, a token is approved when a closing path of at most `tokens_left_after` tokens follows
  // it. A closing path is found by a greedy search over the single-byte tokens and the DSML marker
  // (text the grammar forces taken whole, in the longest ASCII tokens that spell it, steps that
  // close a rule first, no grammar state visited twice), so it bounds the shortest completion from
  // above. Once a search from the output's state runs past kMaxClosingTokens, closing is off for
  // the request (nothing could close it; the search would cost every token). A token that fails gets the mask of the
  // single-byte tokens (and the marker, and the end of sentence once complete) that pass; under a
  // `</think>` gate, `</think>` itself once the reasoning would leave the answer no room.
  const uint32_t* mask_to_finish_within(int32_t token, int tokens_left_after) override;
  // The length of a closing path from the start (the search above), plus `</think>` under a gate:
  // the fewest output tokens cedar can guarantee a complete output in. -1 when none was found.
  // Call before the first token.
  int tokens_to_complete();
  // The grammar is complete and took the stop token.
  bool terminated() const;
  // Back to the state start() gave (the grammar not begun; before `</think>` when gated).
  void reset();

 private:
  friend class GrammarEngine;
  struct Impl;
  explicit GrammarConstraint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

inline constexpr int64_t kDefaultGrammarCacheBytes = int64_t{256} << 20;  // --grammar-cache

struct GrammarEngineOptions {
  CompileOptions compile;
  int64_t cache_bytes = kDefaultGrammarCacheBytes;  // the compiled-grammar cache's budget
  // The largest compiled grammar accepted (CompiledGrammar::MemorySizeBytes); 0: a quarter of
  // cache_bytes, so the cache holds at least four.
  int64_t max_grammar_bytes = 0;
};

class GrammarEngine {
 public:
  // `vocab_size`: the engine's logits width (may exceed the tokenizer's; the extra ids are never
  // allowed). Fails when the tokenizer is not byte-level or lacks an end-of-sentence token.
  static Result<std::unique_ptr<GrammarEngine>> create(const tokenizer::Tokenizer& tokenizer, int vocab_size,
                                                       GrammarEngineOptions options = {});
  ~GrammarEngine();

  // Compiles (or finds in the cache) the grammar of `spec` and returns a fresh matcher over it. The
  // compilation runs on the executor's threads; this thread waits for it until its deadline or until
  // `cancelled` (polled, may be empty) returns true. InvalidArgument, with xgrammar's reason, for a
  // schema or pattern it cannot compile, one over the deadline or over the memory limit;
  // ResourceExhausted when too many compilations are queued.
  Result<std::shared_ptr<GrammarConstraint>> start(const ConstraintSpec& spec,
                                                   const std::function<bool()>& cancelled = {});

  int vocab_size() const { return vocab_size_; }
  int32_t eos_id() const { return eos_id_; }
  int64_t cache_bytes() const;
  size_t cache_entries() const;
  int64_t max_grammar_bytes() const { return max_grammar_bytes_; }
  CompileExecutor::Stats compile_stats() const { return executor_->stats(); }

 private:
  GrammarEngine() = default;
  Result<std::shared_ptr<const xgrammar::CompiledGrammar>> compile(const ConstraintSpec& spec,
                                                                   const std::function<bool()>& cancelled);

  std::unique_ptr<xgrammar::TokenizerInfo> info_;
  // Declared before the executor: its threads insert into the cache until they are joined.
  std::unique_ptr<CompiledGrammarCache> cache_;
  std::unique_ptr<CompileExecutor> executor_;
  int64_t max_grammar_bytes_ = 0;
  int vocab_size_ = 0;
  int32_t eos_id_ = -1;
  int32_t think_end_id_ = -1;
  // The masks of the reasoning under a `</think>` gate: every token but the end of sentence (and,
  // for tool grammars, the DSML marker).
  std::shared_ptr<const std::vector<uint32_t>> reasoning_mask_, reasoning_mask_dsml_;
  // DSML grammars: the ordinary tokens kept from spelling the DSML marker (grammar_engine.cc).
  std::shared_ptr<const SpelledMarkerTokens> spelled_marker_;
  std::shared_ptr<const ClosingAlphabet> closing_;  // the tokens closing paths are made of
};

// The xgrammar structural tag (JSON text) of a tool-call constraint: DeepSeek-V4.1's DSML calls
// block with one tag per declared tool whose parameters follow the tool's JSON schema
// (xgrammar's "deepseek_v4_1_xml" style). `required`: the block is already open (the prompt ends
// with "<｜DSML｜ calls>\n"); else free text may precede it and the block is optional. InvalidArgument
// when `tools_json` is not an array of named function objects. `max_whitespace_run` bounds the runs
// of white space between the DSML tags and around JSON values.
Result<std::string> dsml_tool_call_structural_tag(const std::string& tools_json, bool required, int max_whitespace_run);

}  // namespace cedar::constrain
