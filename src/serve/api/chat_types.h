// The neutral form of a request, whichever API it came through (Chat Completions, Responses,
// Messages, Completions). The schema files translate wire JSON into these structs and back; the
// chat service and the CLI chat work on these only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace cedar::serve {

// Key order matters: the V4.1 prompt prints tool schemas and response formats as the client sent
// them, so they are held as insertion-ordered JSON.
using OrderedJson = nlohmann::ordered_json;

struct ToolCall {
  std::string id;         // "call_..." (OpenAI), "toolu_..." (Anthropic); echoed back by the client
  std::string name;
  std::string arguments;  // a JSON object, as text
};

enum class Role { kSystem, kUser, kAssistant, kTool };

struct Message {
  Role role = Role::kUser;
  std::string content;
  std::string reasoning;             // assistant: the thinking text (reasoning_content)
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool: which call this result answers
  // assistant: content and reasoning are this server's own generated text, restored by the replay
  // store; their marker spellings are the tokens the model produced (never set from a request).
  bool model_text = false;
  // assistant, the last message only: continue it instead of starting a new turn (Chat Completions'
  // `prefix: true`, deepseek-recipe's only way to ask for a continuation).
  bool prefix = false;
  // user, with images only: the content as the encoder's blocks, in order: {"type": "text", "text"}
  // and {"type": "image_url", "image_url": {"url": a base64 data URL}} (content keeps the joined text).
  OrderedJson content_blocks = nullptr;
};

struct SamplingOptions {
  int max_tokens = 0;                 // 0: the server's default
  float temperature = 1.0f;           // the model card's recommendation
  std::optional<uint64_t> seed;       // unset: a fresh seed per request
  std::vector<std::string> stop;      // stop strings (cut from the visible text)
  // Report the log-probability of every content token, with this many alternatives
  // (0..runtime::kMaxTopLogprobs). See docs/SERVER.md, "Log-probabilities".
  bool logprobs = false;
  int top_logprobs = 0;
};

struct StreamOptions {
  bool stream = false;
  bool include_usage = false;  // OpenAI stream_options.include_usage: a final chunk with usage
};

// Reasoning controls after each API's fields are mapped (see docs/SERVER.md, "Reasoning effort").
struct ReasoningOptions {
  std::optional<bool> thinking;         // unset: the server's default mode
  std::optional<int> effort;            // 1..100; only meaningful in thinking mode
};

// What constrained decoding enforces on the answer of a request without tools (response_format).
struct AnswerConstraint {
  bool regex = false;  // false: JSON
  std::string text;    // JSON: the schema ("" = any object or array, json_object); regex: the pattern
  bool strict = false; // JSON: the schema is in strict form (no undeclared properties)
  std::string field = "response_format";  // where the request holds it, for errors ("text.format.schema")
};

struct ChatRequest {
  std::string model;
  std::vector<Message> messages;
  std::vector<OrderedJson> tools;        // each the function object {"name", "description", "parameters"}
  // tool_choice "required" or a named function (then `tools` holds that one only): the turn must be
  // tool calls. "none" removes the tools; "auto" (the default) leaves this false.
  bool tool_call_required = false;
  std::optional<AnswerConstraint> answer_constraint;
  // What the prompt's "Response Format" section shows: json_object_format() or the JSON schema.
  std::optional<OrderedJson> response_format;
  // json_object (Chat Completions' response_format, Responses' text.format; not json_schema or
  // regex): the answer is read as JSON output, as deepseek-recipe sets parse_json_output.
  bool parse_json_output = false;
  ReasoningOptions reasoning;
  SamplingOptions sampling;
  StreamOptions stream;
  // Responses API: the request settings its response objects report (tools, tool_choice,
  // instructions, text, reasoning, sampling), as deepseek-recipe's ResponsesEcho; null elsewhere.
  OrderedJson responses_echo;
};

struct CompletionRequest {  // POST /v1/completions: a raw prompt, no chat template
  std::string model;
  std::string prompt;
  SamplingOptions sampling;
  StreamOptions stream;
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;     // prompt tokens served from the prefix cache
  int reasoning_tokens = 0;  // completion tokens spent before </think>
};

// One token of a logprobs report: the bytes it adds to the text (possibly part of a UTF-8
// character) and its log-probability under the model's distribution.
struct TokenChoice {
  std::string bytes;
  float logprob = 0;
};

// A content token with its most probable alternatives.
struct TokenLogprob {
  TokenChoice chosen;
  std::vector<TokenChoice> top;
  int text_offset = 0;  // where the token starts in the turn's content, in bytes
};

enum class FinishKind { kStop, kLength, kToolCalls, kCancelled, kError };

// One generated assistant turn, as the parser understood it (never raw DSML in `content`).
struct Completion {
  std::string id;        // "chatcmpl-...", "resp_...", "msg_...", "cmpl-..."
  int64_t created = 0;   // unix seconds
  std::string model;
  std::string content;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
  FinishKind finish = FinishKind::kStop;
  std::string matched_stop;  // the stop string that ended the output, if one did
  Usage usage;
  OrderedJson responses_echo;  // ChatRequest::responses_echo of the request
  bool has_logprobs = false;   // the request asked for them (SamplingOptions::logprobs)
  bool thinking = false;       // the turn was generated in thinking mode
  std::vector<TokenLogprob> logprobs;  // of the content tokens, in order
};

// The effort words every API may use, mapped as DeepSeek's protocol library (deepseek-recipe 0.2.0)
// maps them onto V4.1's 1..100 scale: minimal 50, low 50, medium 75, high 75, xhigh 75, max 100
// (a thinking turn without an effort gets 75, kDefaultEffort). "none" means thinking off. Returns
// nullopt for an unknown word (a 400 at the caller).
std::optional<int> effort_from_word(const std::string& word);

// The response_format of a json_object request: {"type": "json_object"}.
inline OrderedJson json_object_format() { return OrderedJson{{"type", "json_object"}}; }

}  // namespace cedar::serve
