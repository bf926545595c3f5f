// OutputAssembler: turns the engine's token stream into what a client sees, one token at a time:
//
//   ids -> StreamDecoder (whole UTF-8 characters) -> CompletionParser (reasoning / content / DSML
//   tool calls, read as deepseek-recipe reads them; each piece is marked as the text of ordinary
//   tokens or of one special token, so a marker spelled with ordinary tokens is text) -> stop
//   strings (cut from the visible content, held back while a match is still possible) ->
//   StreamSink events, and the accumulated Completion. The end-of-sentence token ends the turn and
//   is not parsed.
//
// Raw mode (/v1/completions) skips the parser: the decoded text (special tokens dropped) is the
// content.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/completion_parser.h"
#include "runtime/engine.h"
#include "serve/api/api_error.h"
#include "serve/api/chat_types.h"
#include "serve/api/stream_sink.h"
#include "tokenizer/tokenizer.h"

namespace cedar::serve {

enum class OutputMode { kChat, kRaw };

struct OutputSettings {
  OutputMode mode = OutputMode::kChat;
  chat::ThinkingMode thinking = chat::ThinkingMode::kChat;
  std::vector<std::string> stop;       // stop strings on the content
  std::string tool_id_prefix = "call_";  // ids of the tool calls this turn makes
  // False when the request declared no tools or chose "none": DSML the model writes anyway stays
  // content, and the turn makes no tool call (as deepseek-recipe parses it).
  bool parse_tool_calls = true;
  // A json_object response format (Chat Completions, Responses): the answer is read as JSON output,
  // text around the JSON shown as spaces (deepseek-recipe's parse_json_output; completion_parser.h).
  bool parse_json_output = false;
  // Report the content tokens' log-probabilities (Completion::logprobs, StreamSink::on_content).
  bool logprobs = false;
  // Text of the answer the prompt already holds (a forced tool call's "\n\n<｜DSML｜ calls>\n",
  // chat_prompt.h): parsed before the first generated token, so the turn reads as the model's.
  std::string output_prefix;
  // Where the parser starts: a continued assistant message resumes inside its reasoning or answer.
  chat::ParseStart parse_start = chat::ParseStart::kNewTurn;
};

class OutputAssembler {
 public:
  // `sink` may be null (a non-streaming response reads the Completion at the end).
  OutputAssembler(const tokenizer::Tokenizer& tokenizer, OutputSettings settings, StreamSink* sink);

  // Consumes one generated token. After a stop string matched or an id outside the vocabulary,
  // further tokens are ignored; the caller should cancel the generation (wants_stop()).
  void push(int32_t token);
  // The same, with the token's log-probabilities: entry `index` of `logprobs` (settings.logprobs).
  void push(int32_t token, const runtime::TokenLogprobs& logprobs, size_t index);
  bool wants_stop() const { return stop_matched_ || failure_.has_value(); }
  // Set when the engine produced an id the tokenizer cannot decode (an engine bug). Malformed DSML
  // or a control marker in the wrong place is no failure: the parser reads every text.
  const std::optional<std::string>& failure() const { return failure_; }

  // Ends the turn: flushes held-back text, settles the finish reason and usage from the engine's
  // result. Returns the error to report after a failure().
  std::optional<ApiError> finish(const runtime::GenerationResult& result, Completion* turn);

  // What the model wrote after its reasoning, up to the EOS marker (ReplayTurn::raw); nullopt in
  // thinking mode when the reasoning never ended with the `</think>` token (nothing to replay).
  std::optional<std::string> raw_after_reasoning() const;

 private:
  void handle(const chat::ParseEvent& event);
  // Feeds the text `token` completed to the parser with its kind (token -1: plain bytes).
  void feed_parser(int32_t token, std::string_view text);
  void feed_output_prefix();
  void content_text(std::string_view text);
  // `event`: the parser's delta, which says what text it shows (raw mode: none, the text is looked
  // up in decoded_).
  void emit_content(std::string_view text, const chat::ParseEvent* event = nullptr);
  void flush_held_content();
  // The not yet reported tokens whose text overlaps decoded_[from, to), appended to turn_.logprobs.
  // `collapsed`: the delta is one space standing for that text, so every token of it starts at the
  // space.
  void report_tokens(size_t from, size_t to, bool collapsed = false);

  const tokenizer::Tokenizer& tokenizer_;
  const OutputSettings settings_;
  StreamSink* sink_;
  tokenizer::StreamDecoder decoder_;
  chat::CompletionParser parser_;
  std::optional<int32_t> eos_id_;        // ends the turn
  std::unordered_map<int32_t, std::string> added_;  // the added (special) tokens and their text

  std::string decoded_;        // every decoded character so far
  std::string held_content_;   // content not yet shown: it may be the start of a stop string
  size_t longest_stop_ = 0;
  bool stop_matched_ = false;
  bool parser_done_ = false;
  bool prefix_fed_ = false;
  bool ended_ = false;  // the end-of-sentence token came
  std::optional<std::string> failure_;
  Completion turn_;            // content, reasoning, tool calls so far
  int tokens_ = 0;

  // Logprobs (settings.logprobs): every token's text span in decoded_ [start, end) (empty for a
  // token that completed no character yet) and its probabilities; tokens are reported with the
  // first content delta that shows their text, so reasoning, markup and tool call tokens are not.
  struct TokenSpan {
    size_t start = 0, end = 0;
  };
  std::vector<int32_t> ids_;
  std::vector<TokenSpan> spans_;
  runtime::TokenLogprobs probs_;
  size_t next_report_ = 0;     // first token not yet reported or skipped
  size_t content_cursor_ = 0;  // raw mode, in decoded_: where the next content delta is looked for
};

}  // namespace cedar::serve
