#include "serve/api/anthropic_schema.h"

#include "serve/api/output_constraint.h"

#include <cstdio>
#include <functional>

#include "serve/api/chat_prompt.h"
#include "serve/api/prompt_schema.h"
#include "serve/http/sse.h"

namespace cedar::serve {
namespace {

constexpr int64_t kMaxTokensField = 1 << 30;

// Anthropic's thinking blocks carry a signature that clients hand back unchanged. cedar checks
// nothing with it; it only has to be a non-empty string tied to the text.
std::string thinking_signature(const std::string& thinking) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "cedar-%016zx", std::hash<std::string>{}(thinking));
  return buf;
}

SchemaError text_of_blocks(const OrderedJson& blocks, const std::string& path, std::string* out) {
  return read_text_content(blocks, path, {"text"}, out);
}

void append_paragraph(std::string* text, const std::string& more) {
  if (!text->empty()) *text += "\n\n";
  *text += more;
}

SchemaError parse_user_message(const OrderedJson& content, const std::string& path, std::vector<Message>* out) {
  if (content.is_string()) {
    out->push_back(Message{Role::kUser, content.get<std::string>(), "", {}, ""});
    return std::nullopt;
  }
  if (!content.is_array()) return invalid_request("'" + path + "' must be a string or an array of content blocks", path);
  // Tool results first (they answer the assistant turn before), then the user's own text and images.
  std::string text;
  OrderedJson blocks = OrderedJson::array();
  bool any_image = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const OrderedJson& block = content[i];
    const std::string bpath = field_path(path, i);
    if (!block.is_object()) return invalid_request("'" + bpath + "' must be an object", bpath);
    std::string type;
    CEDAR_SCHEMA_TRY(read_string(block, "type", bpath, &type, /*required=*/true));
    if (type == "text") {
      std::string t;
      CEDAR_SCHEMA_TRY(read_string(block, "text", bpath, &t, /*required=*/true));
      append_paragraph(&text, t);
      blocks.push_back({{"type", "text"}, {"text", std::move(t)}});
    } else if (type == "image") {
      std::string url;
      CEDAR_SCHEMA_TRY(read_image_part(block, type, bpath, &url));
      blocks.push_back({{"type", "image_url"}, {"image_url", {{"url", std::move(url)}}}});
      any_image = true;
    } else if (type == "tool_result") {
      Message m;
      m.role = Role::kTool;
      CEDAR_SCHEMA_TRY(read_string(block, "tool_use_id", bpath, &m.tool_call_id, /*required=*/true));
      if (block.contains("content"))
        CEDAR_SCHEMA_TRY(text_of_blocks(block["content"], field_path(bpath, "content"), &m.content));
      out->push_back(std::move(m));
    } else {
      return invalid_request("'" + field_path(bpath, "type") + "' is \"" + type +
                                 "\": cedar accepts text, image and tool_result blocks from the user",
                             field_path(bpath, "type"));
    }
  }
  if (!text.empty() || any_image || out->empty() || out->back().role != Role::kTool) {
    out->push_back(Message{Role::kUser, text, "", {}, ""});
    if (any_image) out->back().content_blocks = std::move(blocks);
  }
  return std::nullopt;
}

SchemaError parse_assistant_message(const OrderedJson& content, const std::string& path, std::vector<Message>* out) {
  Message m;
  m.role = Role::kAssistant;
  if (content.is_string()) {
    m.content = content.get<std::string>();
    out->push_back(std::move(m));
    return std::nullopt;
  }
  if (!content.is_array()) return invalid_request("'" + path + "' must be a string or an array of content blocks", path);
  for (size_t i = 0; i < content.size(); ++i) {
    const OrderedJson& block = content[i];
    const std::string bpath = field_path(path, i);
    if (!block.is_object()) return invalid_request("'" + bpath + "' must be an object", bpath);
    std::string type;
    CEDAR_SCHEMA_TRY(read_string(block, "type", bpath, &type, /*required=*/true));
    if (type == "text") {
      std::string t;
      CEDAR_SCHEMA_TRY(read_string(block, "text", bpath, &t, /*required=*/true));
      append_paragraph(&m.content, t);
    } else if (type == "thinking") {
      std::string t;
      CEDAR_SCHEMA_TRY(read_string(block, "thinking", bpath, &t, /*required=*/true));
      m.reasoning += t;
    } else if (type == "redacted_thinking") {
      // Never produced by cedar (it redacts nothing); another model's opaque reasoning is dropped.
    } else if (type == "tool_use") {
      ToolCall call;
      CEDAR_SCHEMA_TRY(read_string(block, "id", bpath, &call.id, /*required=*/true));
      CEDAR_SCHEMA_TRY(read_string(block, "name", bpath, &call.name, /*required=*/true));
      auto input = block.find("input");
      if (input == block.end() || !input->is_object())
        return invalid_request("'" + field_path(bpath, "input") + "' must be an object", field_path(bpath, "input"));
      call.arguments = to_wire(*input);
      m.tool_calls.push_back(std::move(call));
    } else {
      return invalid_request("'" + field_path(bpath, "type") + "' is \"" + type +
                                 "\"; cedar accepts text, thinking and tool_use blocks from the assistant",
                             field_path(bpath, "type"));
    }
  }
  out->push_back(std::move(m));
  return std::nullopt;
}

SchemaError parse_tools(const OrderedJson& tools, std::vector<OrderedJson>* out) {
  if (tools.is_null()) return std::nullopt;
  if (!tools.is_array()) return invalid_request("'tools' must be an array", "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string path = field_path("tools", i);
    const OrderedJson& t = tools[i];
    if (!t.is_object()) return invalid_request("'" + path + "' must be an object", path);
    std::string type = "custom", name, description;
    CEDAR_SCHEMA_TRY(read_string(t, "type", path, &type));
    if (type != "custom")
      return invalid_request("'" + field_path(path, "type") + "' is \"" + type +
                                 "\"; cedar serves client tools with an input_schema only (no server tools)",
                             field_path(path, "type"));
    CEDAR_SCHEMA_TRY(read_string(t, "name", path, &name, /*required=*/true));
    CEDAR_SCHEMA_TRY(check_tool_name(name, field_path(path, "name")));
    CEDAR_SCHEMA_TRY(read_string(t, "description", path, &description));
    auto schema = t.find("input_schema");
    if (schema == t.end() || !schema->is_object())
      return invalid_request("'" + field_path(path, "input_schema") + "' must be a JSON schema object",
                             field_path(path, "input_schema"));
    OrderedJson fn;  // the OpenAI function shape the V4.1 tools block prints
    fn["name"] = name;
    if (t.contains("description")) fn["description"] = description;
    fn["parameters"] = *schema;
    out->push_back(std::move(fn));
  }
  return std::nullopt;
}

SchemaError parse_thinking(const OrderedJson& body, ReasoningOptions* reasoning) {
  auto thinking = body.find("thinking");
  if (thinking != body.end() && !thinking->is_null()) {
    if (!thinking->is_object()) return invalid_request("'thinking' must be an object", "thinking");
    std::string type;
    CEDAR_SCHEMA_TRY(read_string(*thinking, "type", "thinking", &type, /*required=*/true));
    if (type == "enabled" || type == "adaptive") {
      reasoning->thinking = true;
    } else if (type == "disabled") {
      reasoning->thinking = false;
    } else {
      return invalid_request("'thinking.type' must be enabled, adaptive or disabled", "thinking.type");
    }
    std::optional<int64_t> budget;
    CEDAR_SCHEMA_TRY(read_int(*thinking, "budget_tokens", "thinking", 0, kMaxTokensField, &budget));
  }
  auto config = body.find("output_config");
  if (config != body.end() && !config->is_null()) {
    if (!config->is_object()) return invalid_request("'output_config' must be an object", "output_config");
    if (config->contains("effort") && !(*config)["effort"].is_null()) {
      const std::optional<bool> explicit_thinking = reasoning->thinking;
      CEDAR_SCHEMA_TRY(read_effort((*config)["effort"], "output_config.effort", reasoning));
      // Effort tunes thinking; it does not switch on what the request switched off.
      if (explicit_thinking.has_value() && !*explicit_thinking) reasoning->thinking = false;
    }
  }
  return std::nullopt;
}

// output_config.format {type: json_schema, schema}: Anthropic's structured outputs. deepseek-recipe
// derives no constraint from it; cedar enforces the schema anyway (Anthropic guarantees it), in
// the form the client sent (a loose schema stays loose).
SchemaError parse_output_format(const OrderedJson& body, ChatRequest* request) {
  auto config = body.find("output_config");
  if (config == body.end() || !config->is_object() || !config->contains("format") || (*config)["format"].is_null())
    return std::nullopt;
  const OrderedJson& format = (*config)["format"];
  if (!format.is_object()) return invalid_request("'output_config.format' must be an object", "output_config.format");
  std::string type;
  CEDAR_SCHEMA_TRY(read_string(format, "type", "output_config.format", &type, /*required=*/true));
  if (type != "json_schema" || !format.contains("schema") || !format["schema"].is_object())
    return invalid_request("'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}",
                           "output_config.format");
  request->response_format = OrderedJson{{"type", "json_schema"}, {"json_schema", {{"schema", format["schema"]}}}};
  request->answer_constraint = AnswerConstraint{false, format["schema"].dump(), false, "output_config.format.schema"};
  return std::nullopt;
}

}  // namespace

SchemaError parse_messages_request(const OrderedJson& body, ChatRequest* out, bool for_counting) {
  CEDAR_SCHEMA_TRY(read_string(body, "model", "", &out->model));
  std::optional<int64_t> max_tokens;
  CEDAR_SCHEMA_TRY(read_int(body, "max_tokens", "", 1, kMaxTokensField, &max_tokens));
  // Anthropic requires max_tokens; deepseek-recipe (and so cedar) falls back to the default budget.
  if (max_tokens) out->sampling.max_tokens = static_cast<int>(*max_tokens);
  if (body.contains("system") && !body["system"].is_null()) {
    Message system;
    system.role = Role::kSystem;
    CEDAR_SCHEMA_TRY(text_of_blocks(body["system"], "system", &system.content));
    out->messages.push_back(std::move(system));
  }
  auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array() || messages->empty())
    return invalid_request("'messages' must be a non-empty array", "messages");
  for (size_t i = 0; i < messages->size(); ++i) {
    const OrderedJson& m = (*messages)[i];
    const std::string path = field_path("messages", i);
    if (!m.is_object()) return invalid_request("'" + path + "' must be an object", path);
    std::string role;
    CEDAR_SCHEMA_TRY(read_string(m, "role", path, &role, /*required=*/true));
    const OrderedJson null_content;
    const OrderedJson& content = m.contains("content") ? m["content"] : null_content;
    if (role == "user") {
      CEDAR_SCHEMA_TRY(parse_user_message(content, field_path(path, "content"), &out->messages));
    } else if (role == "assistant") {
      CEDAR_SCHEMA_TRY(parse_assistant_message(content, field_path(path, "content"), &out->messages));
    } else {
      return invalid_request("'" + field_path(path, "role") + "' must be \"user\" or \"assistant\"",
                             field_path(path, "role"));
    }
  }
  if (body.contains("tools")) CEDAR_SCHEMA_TRY(parse_tools(body["tools"], &out->tools));
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const OrderedJson& tc = body["tool_choice"];
    std::string type;
    if (!tc.is_object()) return invalid_request("'tool_choice' must be an object", "tool_choice");
    CEDAR_SCHEMA_TRY(read_string(tc, "type", "tool_choice", &type, /*required=*/true));
    if (type == "none") {
      out->tools.clear();
    } else if (type == "tool") {
      std::string name;
      CEDAR_SCHEMA_TRY(read_string(tc, "name", "tool_choice", &name, /*required=*/true));
      CEDAR_SCHEMA_TRY(choose_named_tool(name, "tool_choice.name", out));
    } else if (type != "auto" && type != "any") {
      // "any" keeps the tools with an optional call: deepseek-recipe derives tool_call, not
      // tool_call_required, and renders no forced block for it.
      return invalid_request("'tool_choice.type' must be auto, any, tool or none", "tool_choice.type");
    }
  }
  CEDAR_SCHEMA_TRY(parse_thinking(body, &out->reasoning));
  CEDAR_SCHEMA_TRY(parse_output_format(body, out));
  if (body.contains("stop_sequences"))
    CEDAR_SCHEMA_TRY(read_stop(body["stop_sequences"], "stop_sequences", 16, &out->sampling.stop));
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  CEDAR_SCHEMA_TRY(read_number(body, "temperature", "", 0.0, 1.0, &temperature));
  if (temperature) out->sampling.temperature = static_cast<float>(*temperature);
  CEDAR_SCHEMA_TRY(read_number(body, "top_p", "", 0.0, 1.0, &top_p));  // no effect (see docs)
  CEDAR_SCHEMA_TRY(read_int(body, "top_k", "", 0, INT32_MAX, &top_k));  // no effect (see docs)
  CEDAR_SCHEMA_TRY(read_bool(body, "stream", "", &out->stream.stream));
  out->stream.include_usage = true;
  return std::nullopt;
}

namespace {

const char* stop_reason(const Completion& c) {
  switch (c.finish) {
    case FinishKind::kLength: return "max_tokens";
    case FinishKind::kToolCalls: return "tool_use";
    default: return c.matched_stop.empty() ? "end_turn" : "stop_sequence";
  }
}

OrderedJson usage_json(const Usage& u, bool final) {
  OrderedJson usage;
  // Anthropic counts cache reads apart from input_tokens.
  usage["input_tokens"] = final ? u.prompt_tokens - u.cached_tokens : u.prompt_tokens;
  usage["cache_creation_input_tokens"] = 0;
  usage["cache_read_input_tokens"] = final ? u.cached_tokens : 0;
  usage["output_tokens"] = u.completion_tokens;
  return usage;
}

OrderedJson tool_use_block(const ToolCall& call, bool with_input) {
  return {{"type", "tool_use"},
          {"id", call.id},
          {"name", call.name},
          {"input", with_input ? arguments_object(call.arguments) : OrderedJson::object()}};
}

}  // namespace

std::string render_message(const Completion& c) {
  OrderedJson content = OrderedJson::array();
  // As deepseek-recipe: a thinking turn always has its thinking block (empty when the model went
  // straight to </think>), and an empty answer has no text block.
  if (!c.reasoning.empty() || c.thinking)
    content.push_back({{"type", "thinking"}, {"thinking", c.reasoning}, {"signature", thinking_signature(c.reasoning)}});
  if (!c.content.empty()) content.push_back({{"type", "text"}, {"text", c.content}});
  for (const ToolCall& call : c.tool_calls) content.push_back(tool_use_block(call, true));
  OrderedJson m;
  m["id"] = c.id;
  m["type"] = "message";
  m["role"] = "assistant";
  m["model"] = c.model;
  m["content"] = std::move(content);
  m["stop_reason"] = stop_reason(c);
  m["stop_sequence"] = c.matched_stop.empty() ? OrderedJson(nullptr) : OrderedJson(c.matched_stop);
  m["usage"] = usage_json(c.usage, true);
  return to_wire(m);
}

std::string render_token_count(int input_tokens) { return to_wire({{"input_tokens", input_tokens}}); }

std::string render_anthropic_error(const ApiError& e) {
  return to_wire({{"type", "error"}, {"error", {{"type", e.anthropic_type()}, {"message", e.message}}}});
}

// ---- Streaming.

void MessagesStream::event(const char* type, OrderedJson payload) {
  OrderedJson e;
  e["type"] = type;
  for (auto it = payload.begin(); it != payload.end(); ++it) e[it.key()] = std::move(it.value());
  out_ += sse_event(type, to_wire(e));
}

void MessagesStream::on_start(const Completion& header) {
  header_thinking_ = header.thinking;
  OrderedJson m;
  m["id"] = header.id;
  m["type"] = "message";
  m["role"] = "assistant";
  m["model"] = header.model;
  m["content"] = OrderedJson::array();
  m["stop_reason"] = nullptr;
  m["stop_sequence"] = nullptr;
  m["usage"] = usage_json(header.usage, false);
  event("message_start", {{"message", std::move(m)}});
  event("ping", OrderedJson::object());
}

void MessagesStream::close_open_block() {
  if (open_ == Open::kThinking)
    event("content_block_delta",
          {{"index", block_index_},
           {"delta", {{"type", "signature_delta"}, {"signature", thinking_signature(thinking_)}}}});
  if (open_ != Open::kNone) event("content_block_stop", {{"index", block_index_}});
  open_ = Open::kNone;
  thinking_.clear();
}

void MessagesStream::on_reasoning(std::string_view delta) {
  if (open_ != Open::kThinking) {
    close_open_block();
    open_ = Open::kThinking;
    event("content_block_start",
          {{"index", ++block_index_}, {"content_block", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}}});
  }
  thinking_ += delta;
  if (delta.empty()) return;
  event("content_block_delta",
        {{"index", block_index_}, {"delta", {{"type", "thinking_delta"}, {"thinking", std::string(delta)}}}});
}

void MessagesStream::open_empty_thinking_block() {
  if (!header_thinking_ || block_index_ >= 0) return;
  on_reasoning("");
}

void MessagesStream::on_content(std::string_view delta, std::span<const TokenLogprob>) {
  open_empty_thinking_block();
  if (open_ != Open::kText) {
    close_open_block();
    open_ = Open::kText;
    event("content_block_start", {{"index", ++block_index_}, {"content_block", {{"type", "text"}, {"text", ""}}}});
  }
  event("content_block_delta",
        {{"index", block_index_}, {"delta", {{"type", "text_delta"}, {"text", std::string(delta)}}}});
}

void MessagesStream::on_tool_call(size_t index, const ToolCall& call) {
  open_empty_thinking_block();
  close_open_block();
  event("content_block_start", {{"index", ++block_index_}, {"content_block", tool_use_block(call, false)}});
  // The arguments as written, also when they are not JSON (the model wrote a non-JSON value for a
  // string="false" parameter): deepseek-recipe streams them so. The Anthropic SDK's stream
  // accumulator raises on such text, but only scripted output holds it: cedar's tool grammars keep
  // a served model's arguments valid JSON, in the answer and (the marker masked) never in reasoning.
  event("content_block_delta",
        {{"index", block_index_}, {"delta", {{"type", "input_json_delta"}, {"partial_json", call.arguments}}}});
  event("content_block_stop", {{"index", block_index_}});
}

void MessagesStream::on_finish(const Completion& done) {
  open_empty_thinking_block();
  close_open_block();
  event("message_delta",
        {{"delta",
          {{"stop_reason", stop_reason(done)},
           {"stop_sequence", done.matched_stop.empty() ? OrderedJson(nullptr) : OrderedJson(done.matched_stop)}}},
         {"usage", usage_json(done.usage, true)}});
  event("message_stop", OrderedJson::object());
}

void MessagesStream::on_error(const ApiError& error) {
  event("error", {{"error", {{"type", error.anthropic_type()}, {"message", error.message}}}});
}

}  // namespace cedar::serve
