// Streaming parser for DeepSeek completions: separates reasoning, content and DSML tool calls
// while the model is still generating, with the result the official
// parse_message_from_completion_text (encoding.py) gives on the whole text.
//
// Feed it the completion text (what follows the generation header, EOS included) in pieces of
// any size, e.g. one decoded token at a time:
//
//   CompletionParser parser(ThinkingMode::kThinking);
//   for (each token) for (const ParseEvent& e : parser.feed(text_of_token)) handle(e);
//   for (const ParseEvent& e : parser.finish()) handle(e);   // end of generation
//
// Events: reasoning and content deltas (never holding DSML markup or control markers: text that
// might begin a marker is held back until it is decided), one ToolCall per closed invoke (name and
// the JSON arguments string rebuilt from the DSML parameters as the official decoder does), then
// either Done or one Error with a clear message. After an Error or Done, feed() returns nothing.
//
// Stricter than the official parser on purpose: text that ends inside a DSML block (a truncated
// tool call) is an error, where the official parser can accept a half-written invoke.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/chat_encoding.h"

namespace cedar::tokenizer {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object text, e.g. {"city": "Paris", "days": 3}
};

struct ParseEvent {
  enum class Type { kReasoningDelta, kContentDelta, kToolCall, kError, kDone };
  Type type;
  std::string text;    // the delta, or the error message
  ToolCall tool_call;  // kToolCall only
};

class CompletionParser {
 public:
  explicit CompletionParser(ThinkingMode mode, PromptFormat format = PromptFormat::kV41);
  // Off: DSML in the content is plain text and no tool call is ever reported (a request that
  // declared no tools, or tool_choice "none": deepseek-recipe's parse_tool_calls = false).
  void set_parse_tool_calls(bool on) { parse_tool_calls_ = on; }

  // Consumes the next piece of completion text.
  std::vector<ParseEvent> feed(std::string_view text);
  // The completion has ended (EOS seen or generation stopped): flushes and reports truncation.
  std::vector<ParseEvent> finish();

  bool done() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kFailed; }

 private:
  enum class State { kReasoning, kContent, kToolCalls, kAfterCalls, kAfterEos, kDone, kFailed };
  enum class CallState { kBetweenInvokes, kInvokeName, kParameter, kAfterParameter };

  void run(std::vector<ParseEvent>* events, bool at_end);
  bool scan_text(std::vector<ParseEvent>* events, bool at_end);
  bool scan_calls(std::vector<ParseEvent>* events, bool at_end);
  void fail(std::vector<ParseEvent>* events, std::string message);

  PromptFormat format_;
  State state_;
  bool parse_tool_calls_ = true;
  CallState call_state_ = CallState::kBetweenInvokes;
  std::string pending_;  // text received but not yet consumed
  // Markers of the format.
  std::string calls_start_, calls_end_, invoke_start_, invoke_end_, param_start_, param_end_;
  // The invoke being read.
  std::string call_name_;
  std::vector<std::pair<std::string, std::pair<std::string, bool>>> call_params_;  // name -> (value, is_string)
};

// The whole-text form: parses a complete completion into the assistant message fields, or the
// error the streaming parser reports.
struct ParsedCompletion {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
};
Result<ParsedCompletion> parse_completion(std::string_view text, ThinkingMode mode,
                                          PromptFormat format = PromptFormat::kV41);

// decode_dsml_to_arguments: {"name": value, ...} where string parameters are JSON-quoted and the
// others are inserted as written.
std::string dsml_arguments_json(const std::vector<std::pair<std::string, std::pair<std::string, bool>>>& params);

}  // namespace cedar::tokenizer
