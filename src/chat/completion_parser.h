// Streaming parser for DeepSeek completions: separates reasoning, content and DSML tool calls while
// the model is still generating, with the rules of DeepSeek's protocol library deepseek-recipe 0.2.0
// (its stream processor's output parser), so that what cedar answers equals what deepseek-recipe
// answers for the same tokens, malformed output included.
//
// Feed it the completion text (what follows the generation header, without the end-of-sentence
// token: the engine stops there) in pieces of any size, each with its ChunkKind:
//
//   CompletionParser parser(ThinkingMode::kThinking);
//   for (each token) for (const ParseEvent& e : parser.feed(text_of_token, kind_of_token)) handle(e);
//   for (const ParseEvent& e : parser.finish()) handle(e);   // end of generation
//
// The rules (the output parser is a set of markers per stage; a marker is plain text and
// special-token parts, and a special-token part only matches text decoded from that special token):
//   - Reasoning (thinking mode) ends at `</think>`; the newlines before it and those that begin the
//     reasoning or the answer are dropped.
//   - Content: a stop sequence (set_stop_sequences) ends the turn first; it matches text of
//     ordinary tokens only, never a special token's text.
//   - Content: `<｜DSML｜` (any newlines before it dropped) opens the tool calls wherever it stands,
//     after text, after one newline, or without a calls tag; so does it in the reasoning. `</think>`
//     in content is dropped. Everything else (a stray `｜DSML｜`, `</｜DSML｜ calls>`, `<think>`,
//     BOS, EOS spelled in text, any marker spelled with ordinary tokens) is text.
//   - Tool calls: text is skipped up to `invoke name="` (a call begins; its name runs to the next
//     `"`) or to `</｜DSML｜ calls>` / `</｜DSML｜tool_calls>` (the turn's output is over: the rest
//     is dropped). Inside a call, `parameter name=` starts an argument whose name runs (written as
//     is, quotes included) to a space, then `true">` (a string value, JSON-escaped) or `false">`
//     (written as is) up to `</｜DSML｜`; `</｜DSML｜` outside a value closes the call. The arguments
//     are the concatenation `{` name `: ` value `, ` ... `}`, so malformed DSML gives what
//     deepseek-recipe gives (possibly not JSON), never an error. After an unknown tag such as
//     `<｜DSML｜ foo>` nothing but those markers is read, so the rest of the turn is dropped.
//   - A call still open when the text ends is reported with the arguments written so far.
//   - JSON output (set_parse_json_output: a json_object response format) extracts the JSON from the
//     answer: it starts after a fence line (```json or ``` and a newline; the line is dropped) or at
//     the first `{` / `[` (kept), and ends at a newline + ``` (dropped) or with the text. Answer
//     text outside it becomes one space per fed piece it spans, as deepseek-recipe's stream
//     processor writes it; leading newlines are dropped, `<｜DSML｜` still opens the tool calls
//     before the JSON and after its closing fence (never inside it), and stop sequences match only
//     inside it.
//
// Events: reasoning and content deltas (text that may still begin a marker or a stop sequence is
// held back until it is decided), one ToolCall per call (when it closes, or at finish() if it never
// did), a Stop when a stop sequence matched, then Done from finish(). There are no errors: every
// text has a reading. After Done, feed() returns nothing.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_encoding.h"
#include "core/status.h"

namespace cedar::chat {

// Where a piece of completion text comes from, which decides whether a marker's special-token part
// (`｜DSML｜`, `</think>`) can match it (deepseek-recipe's ChunkKind).
enum class ChunkKind {
  kText,          // text without token boundaries: every marker matches its spelling
  kPlainTokens,   // decoded from ordinary tokens: only the plain parts of markers match
  kSpecialToken,  // the text of one special (added) token: only special-token parts match
};

struct ToolCall {
  std::string name;
  std::string arguments;  // built from the DSML parameters, e.g. {"city": "Paris", "days": 3}
};

struct ParseEvent {
  enum class Type { kReasoningDelta, kContentDelta, kToolCall, kStop, kDone };
  Type type;
  std::string text;    // the delta, or the stop sequence that matched (kStop: the turn ends there)
  ToolCall tool_call;  // kToolCall only
  // Deltas: the fed bytes [source_begin, source_end) the delta shows (offsets in all text fed so
  // far), so a caller can tell which tokens it shows; a delta never spans bytes it does not show.
  // `collapsed`: JSON output wrote that text (around the JSON, within one piece) as this one space.
  size_t source_begin = 0, source_end = 0;
  bool collapsed = false;
};

// Where parsing begins (deepseek-recipe's ThinkingInitialStage). A new turn drops the newlines that
// begin it; a continued assistant message (Chat `prefix: true`, thinking mode) resumes inside its
// reasoning or, once its answer has begun, inside the answer, keeping leading newlines.
enum class ParseStart { kNewTurn, kReasoningContinuation, kContentContinuation };

class CompletionParser {
 public:
  // `start` other than kNewTurn applies to thinking mode only (outside it, parsing begins as a new
  // turn's answer, as deepseek-recipe parses a continuation there).
  explicit CompletionParser(ThinkingMode mode, ParseStart start = ParseStart::kNewTurn);
  // Off: DSML in the content is plain text and no tool call is ever reported (a request that
  // declared no tools, or tool_choice "none": deepseek-recipe's parse_tool_calls = false).
  // Set before the first feed().
  void set_parse_tool_calls(bool on);
  // Stop sequences (empty ones ignored), matched in the answer before anything else and only against
  // text of ordinary tokens, as deepseek-recipe matches them: the first that completes ends the
  // turn with a kStop event (the text before it is content). Set before the first feed().
  void set_stop_sequences(const std::vector<std::string>& stops);
  // deepseek-recipe's parse_json_output (on for a json_object response format): the answer is read
  // as JSON output, see the rules above. Set before the first feed().
  void set_parse_json_output(bool on);

  // Consumes the next piece of completion text.
  std::vector<ParseEvent> feed(std::string_view text, ChunkKind kind);
  // The completion has ended: flushes what was held back, reports a call still open, then Done.
  std::vector<ParseEvent> finish();

  bool done() const { return done_; }
  // Thinking mode: the offset in the fed text just past the `</think>` that ended the reasoning;
  // nullopt while reasoning, or when it never ended that way (tool calls opened inside it).
  std::optional<size_t> reasoning_end() const { return reasoning_end_; }

  // What the parser does with bytes; `label` is the text an arguments label or end writes.
  struct Action {
    enum class Kind {
      kContent, kReasoning, kSkip, kCallBegin, kCallName, kCallNameEnd, kArgumentsRaw, kArgumentsString,
      kArgumentsLabel, kArgumentsEnd, kStop,
      kToSpace,  // JSON output: one space per fed piece the bytes span
      kLabel     // JSON output: write `label` as content (the `{` / `[` that opens bare JSON)
    };
    Kind kind;
    const char* label = "";
    size_t stop = 0;  // kStop: which stop sequence
  };
  enum class Stage {
    kContent, kReasoning, kToolCalls, kToolName, kArguments, kArgumentName, kStringAttribute, kArgumentValue,
    kFinished,
    kJson,      // JSON output: inside the JSON
    kAfterJson  // JSON output: after the JSON's closing fence
  };
  // A stage with its flags (deepseek-recipe's Stage enum values).
  struct StageState {
    Stage stage;
    bool strip_leading_newlines = false;  // kContent, kReasoning
    bool first_argument = false;          // kArguments
    bool string_value = false;            // kArgumentValue
  };
  struct PatternUnit {
    char byte;
    bool special;  // belongs to a special-token part of the marker
  };
  // One way out of a stage: a marker (optionally preceded by any number of newlines, which belong
  // to the match) or the stage's first byte being a newline.
  struct Branch {
    enum class Match { kMarker, kNewlinesAndMarker, kLeadingNewline };
    Match match;
    const std::vector<PatternUnit>* pattern = nullptr;
    const std::vector<size_t>* failure = nullptr;  // KMP failure table of `pattern`
    StageState next;
    Action action;
    size_t matched = 0;     // pattern units matched so far
    size_t newlines = 0;    // kNewlinesAndMarker: newlines before the match
    bool first_byte = true;  // kLeadingNewline
    bool leading_newline = false;
  };

 private:
  void enter(StageState next);
  Action unmatched_action() const;
  bool advance(Branch& b, char byte, ChunkKind kind) const;
  static size_t matching_length(const Branch& b);
  void apply(Action action, size_t length, std::vector<ParseEvent>* events);
  void add_stop_branches();
  void to_spaces(size_t length, std::vector<ParseEvent>* events);

  bool parse_tool_calls_ = true;
  bool parse_json_output_ = false;
  std::vector<std::string> stops_;
  std::vector<std::vector<PatternUnit>> stop_units_;  // branches point into these: set before feeding
  std::vector<std::vector<size_t>> stop_failure_;
  bool done_ = false;
  size_t fed_ = 0;                     // bytes fed so far
  std::optional<size_t> reasoning_end_;
  StageState stage_;
  std::vector<Branch> branches_;  // in priority order: the first that completes at a byte wins
  std::string buffer_;            // fed bytes not yet assigned an action
  // JSON output: deepseek-recipe writes one space per piece of a run of text-to-space bytes that
  // lies in one fed piece, so the pieces' boundaries matter: where the fed pieces at or after the
  // buffer's start begin (offsets in all text fed so far), and whether the last bytes assigned an
  // action (a non-empty run) were turned into a space, which a run continuing in the same piece
  // does not repeat.
  std::deque<size_t> piece_starts_;
  bool last_was_space_ = false;

  // The call being read.
  bool call_open_ = false, call_named_ = false;
  std::string call_name_, call_arguments_;
};

// The whole-text form: parses a complete completion into the assistant message fields. The text is
// one kText chunk (there are no token boundaries, so every marker spelling counts, as in
// deepseek-recipe's Text chunks), and it ends at its first end-of-sentence marker (where the engine
// would have stopped); what follows that marker is ignored.
struct ParsedCompletion {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
};
ParsedCompletion parse_completion(std::string_view text, ThinkingMode mode, bool parse_tool_calls = true);

}  // namespace cedar::chat
