#include "serve/api/responses_schema.h"

#include <algorithm>

#include "runtime/engine.h"
#include "serve/api/chat_prompt.h"
#include "serve/api/logprobs_json.h"
#include "serve/api/output_constraint.h"
#include "serve/http/sse.h"
#include "serve/api/strict_tools.h"

namespace cedar::serve {
namespace {

// deepseek-recipe's ConversionOptions() bound on max_output_tokens (thinking or not): larger is a 400.
constexpr int64_t kMaxTokensField = 393216;

Message& open_assistant_turn(std::vector<Message>& messages) {
  if (messages.empty() || messages.back().role != Role::kAssistant) {
    messages.push_back(Message{});
    messages.back().role = Role::kAssistant;
  }
  return messages.back();
}

SchemaError parse_input_item(const OrderedJson& item, const std::string& path, std::vector<Message>* messages) {
  if (!item.is_object()) return invalid_request("'" + path + "' must be an object", path);
  std::string type;
  CEDAR_SCHEMA_TRY(read_string(item, "type", path, &type));
  if (type.empty() && item.contains("role")) type = "message";  // the "easy" message form
  if (type == "message") {
    std::string role;
    CEDAR_SCHEMA_TRY(read_string(item, "role", path, &role, /*required=*/true));
    const OrderedJson null_content;
    const OrderedJson& content = item.contains("content") ? item["content"] : null_content;
    Message m;
    if (role == "user") {
      CEDAR_SCHEMA_TRY(read_user_content(content, field_path(path, "content"), {"input_text", "output_text", "text"},
                                         {"input_image"}, &m));
    } else {
      CEDAR_SCHEMA_TRY(read_text_content(content, field_path(path, "content"), {"input_text", "output_text", "text"},
                                         &m.content));
    }
    if (role == "user") {
      m.role = Role::kUser;
    } else if (role == "system" || role == "developer") {
      m.role = Role::kSystem;
    } else if (role == "assistant") {
      // Joins the assistant turn before it unless that one made calls (its reasoning, or its text,
      // the two texts then separated by a blank line, as deepseek-recipe merges them); otherwise
      // starts a new assistant turn.
      if (!messages->empty() && messages->back().role == Role::kAssistant && messages->back().tool_calls.empty()) {
        std::string& joined = messages->back().content;
        if (!joined.empty() && !m.content.empty()) joined += "\n\n";
        joined += m.content;
        return std::nullopt;
      }
      m.role = Role::kAssistant;
    } else {
      return invalid_request("'" + field_path(path, "role") + "' is \"" + role +
                                 "\"; expected user, system, developer or assistant",
                             field_path(path, "role"));
    }
    messages->push_back(std::move(m));
    return std::nullopt;
  }
  if (type == "function_call") {
    ToolCall call;
    CEDAR_SCHEMA_TRY(read_string(item, "call_id", path, &call.id, /*required=*/true));
    CEDAR_SCHEMA_TRY(read_string(item, "name", path, &call.name, /*required=*/true));
    CEDAR_SCHEMA_TRY(read_string(item, "arguments", path, &call.arguments));
    CEDAR_SCHEMA_TRY(check_history_arguments(call.arguments, field_path(path, "arguments")));
    open_assistant_turn(*messages).tool_calls.push_back(std::move(call));
    return std::nullopt;
  }
  if (type == "function_call_output") {
    Message m;
    m.role = Role::kTool;
    CEDAR_SCHEMA_TRY(read_string(item, "call_id", path, &m.tool_call_id, /*required=*/true));
    if (!item.contains("output")) return invalid_request("'" + field_path(path, "output") + "' is required", path);
    CEDAR_SCHEMA_TRY(read_text_content(item["output"], field_path(path, "output"), {"input_text", "output_text", "text"},
                                       &m.content));
    messages->push_back(std::move(m));
    return std::nullopt;
  }
  if (type == "reasoning") {
    std::string text;
    if (item.contains("content") && !item["content"].is_null())
      CEDAR_SCHEMA_TRY(read_text_content(item["content"], field_path(path, "content"), {"reasoning_text"}, &text));
    if (text.empty()) CEDAR_SCHEMA_TRY(read_string(item, "encrypted_content", path, &text));
    // Reasoning opens an assistant turn (it comes before that turn's message and calls).
    if (messages->empty() || messages->back().role != Role::kAssistant || !messages->back().content.empty() ||
        !messages->back().tool_calls.empty()) {
      messages->push_back(Message{});
      messages->back().role = Role::kAssistant;
    }
    messages->back().reasoning += text;
    return std::nullopt;
  }
  return invalid_request("'" + field_path(path, "type") + "' is \"" + type +
                             "\"; cedar accepts message, function_call, function_call_output and reasoning items "
                             "(it stores nothing, so item references cannot be resolved)",
                         field_path(path, "type"));
}

SchemaError parse_tools(const OrderedJson& tools, std::vector<OrderedJson>* out) {
  if (tools.is_null()) return std::nullopt;
  if (!tools.is_array()) return invalid_request("'tools' must be an array", "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string path = field_path("tools", i);
    const OrderedJson& t = tools[i];
    if (!t.is_object()) return invalid_request("'" + path + "' must be an object", path);
    std::string type, name;
    CEDAR_SCHEMA_TRY(read_string(t, "type", path, &type, /*required=*/true));
    if (type != "function")
      return invalid_request("'" + field_path(path, "type") + "' is \"" + type +
                                 "\"; cedar serves function tools only (no hosted tools)",
                             field_path(path, "type"));
    CEDAR_SCHEMA_TRY(read_string(t, "name", path, &name, /*required=*/true));
    CEDAR_SCHEMA_TRY(check_tool_name(name, field_path(path, "name")));
    if (t.contains("parameters") && !t["parameters"].is_object() && !t["parameters"].is_null())
      return invalid_request("'" + field_path(path, "parameters") + "' must be a JSON schema object",
                             field_path(path, "parameters"));
    OrderedJson fn = OrderedJson::object();  // the function object as sent, minus the type tag
    for (auto it = t.begin(); it != t.end(); ++it)
      if (it.key() != "type") fn[it.key()] = it.value();
    out->push_back(std::move(fn));
  }
  return std::nullopt;
}

// text.format {type: json_schema, name, schema, strict} -> Chat Completions' response_format shape,
// so the prompt is the same whichever API carried the request; the answer is constrained to it.
// (deepseek-recipe's Responses conversion knows no regex format, so neither does cedar's.)
SchemaError parse_text_format(const OrderedJson& body, ChatRequest* out) {
  auto text = body.find("text");
  if (text == body.end() || text->is_null()) return std::nullopt;
  if (!text->is_object()) return invalid_request("'text' must be an object", "text");
  auto format = text->find("format");
  if (format == text->end() || format->is_null()) return std::nullopt;
  if (!format->is_object()) return invalid_request("'text.format' must be an object", "text.format");
  std::string type;
  CEDAR_SCHEMA_TRY(read_string(*format, "type", "text.format", &type, /*required=*/true));
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    out->response_format = json_object_format();
    out->answer_constraint = AnswerConstraint{};
    out->parse_json_output = true;
    return std::nullopt;
  }
  if (type != "json_schema")
    return invalid_request("'text.format.type' must be text, json_object or json_schema", "text.format.type");
  if (!format->contains("schema") || !(*format)["schema"].is_object())
    return invalid_request("'text.format.schema' must be a JSON schema object", "text.format.schema");
  bool strict = false;
  CEDAR_SCHEMA_TRY(read_bool(*format, "strict", "text.format", &strict));
  out->response_format = (*format)["schema"];  // the prompt shows the schema itself, as deepseek-recipe renders it
  OrderedJson enforced = (*format)["schema"];
  if (strict) CEDAR_SCHEMA_TRY(strict_json_schema((*format)["schema"], "text.format.schema", &enforced));
  out->answer_constraint = AnswerConstraint{false, enforced.dump(), strict, "text.format.schema"};
  return std::nullopt;
}

// Log-probabilities come with include: ["message.output_text.logprobs"]; top_logprobs (0..20)
// says how many alternatives. Other include values are accepted and change nothing (the reasoning
// text always travels in encrypted_content).
SchemaError parse_responses_logprobs(const OrderedJson& body, SamplingOptions* sampling) {
  auto include = body.find("include");
  if (include != body.end() && !include->is_null()) {
    if (!include->is_array()) return invalid_request("'include' must be an array of strings", "include");
    for (size_t i = 0; i < include->size(); ++i) {
      const OrderedJson& v = (*include)[i];
      if (!v.is_string()) return invalid_request("'include' must be an array of strings", field_path("include", i));
      if (v == "message.output_text.logprobs") sampling->logprobs = true;
    }
  }
  std::optional<int64_t> top;
  CEDAR_SCHEMA_TRY(read_int(body, "top_logprobs", "", 0, runtime::kMaxTopLogprobs, &top));
  sampling->top_logprobs = static_cast<int>(top.value_or(0));
  return std::nullopt;
}

}  // namespace

SchemaError parse_responses_request(const OrderedJson& body, ChatRequest* out) {
  CEDAR_SCHEMA_TRY(read_string(body, "model", "", &out->model));
  for (const char* unsupported : {"previous_response_id", "conversation"}) {
    if (body.contains(unsupported) && !body[unsupported].is_null())
      return invalid_request(std::string("'") + unsupported +
                                 "' is not supported: cedar stores no responses; send the whole conversation "
                                 "as input (store=false)",
                             unsupported);
  }
  bool background = false;
  CEDAR_SCHEMA_TRY(read_bool(body, "background", "", &background));
  if (background) return invalid_request("'background' responses are not supported by cedar", "background");
  std::string instructions;
  CEDAR_SCHEMA_TRY(read_string(body, "instructions", "", &instructions));
  if (!instructions.empty()) out->messages.push_back(Message{Role::kSystem, instructions, "", {}, ""});
  auto input = body.find("input");
  if (input == body.end()) return invalid_request("'input' is required", "input");
  if (input->is_string()) {
    out->messages.push_back(Message{Role::kUser, input->get<std::string>(), "", {}, ""});
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i)
      CEDAR_SCHEMA_TRY(parse_input_item((*input)[i], field_path("input", i), &out->messages));
  } else {
    return invalid_request("'input' must be a string or an array of input items", "input");
  }
  if (out->messages.empty()) return invalid_request("'input' holds no items", "input");
  // deepseek-recipe's Responses conversion lists an assistant turn's function calls by call_id
  // (byte order), whatever their order in the input; the prompt must show them the same way.
  for (Message& m : out->messages)
    std::stable_sort(m.tool_calls.begin(), m.tool_calls.end(),
                     [](const ToolCall& a, const ToolCall& b) { return a.id < b.id; });
  if (body.contains("tools")) CEDAR_SCHEMA_TRY(parse_tools(body["tools"], &out->tools));
  CEDAR_SCHEMA_TRY(apply_strict_tools(&out->tools, "tools"));
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const OrderedJson& tc = body["tool_choice"];
    if (tc == "none") {
      out->tools.clear();
    } else if (tc == "required") {
      CEDAR_SCHEMA_TRY(require_tool_call("tool_choice", out));
    } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name") && tc["name"].is_string()) {
      CEDAR_SCHEMA_TRY(choose_named_tool(tc["name"].get<std::string>(), "tool_choice.name", out));
    } else if (tc != "auto") {
      return invalid_request(
          "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}",
          "tool_choice");
    }
  }
  CEDAR_SCHEMA_TRY(parse_text_format(body, out));
  if (body.contains("reasoning") && !body["reasoning"].is_null()) {
    const OrderedJson& r = body["reasoning"];
    if (!r.is_object()) return invalid_request("'reasoning' must be an object", "reasoning");
    if (r.contains("effort")) CEDAR_SCHEMA_TRY(read_effort(r["effort"], "reasoning.effort", &out->reasoning));
  }
  std::optional<int64_t> max_output_tokens;
  CEDAR_SCHEMA_TRY(read_int(body, "max_output_tokens", "", 1, kMaxTokensField, &max_output_tokens));
  if (max_output_tokens) out->sampling.max_tokens = static_cast<int>(*max_output_tokens);
  std::optional<double> temperature, top_p;
  CEDAR_SCHEMA_TRY(read_number(body, "temperature", "", 0.0, 2.0, &temperature));
  if (temperature) out->sampling.temperature = static_cast<float>(*temperature);
  CEDAR_SCHEMA_TRY(read_number(body, "top_p", "", 0.0, 1.0, &top_p));  // no effect (see docs)
  bool store = false, parallel = true;
  CEDAR_SCHEMA_TRY(read_bool(body, "store", "", &store));  // accepted; nothing is ever stored
  CEDAR_SCHEMA_TRY(read_bool(body, "parallel_tool_calls", "", &parallel));
  CEDAR_SCHEMA_TRY(read_bool(body, "stream", "", &out->stream.stream));
  CEDAR_SCHEMA_TRY(parse_responses_logprobs(body, &out->sampling));
  out->stream.include_usage = true;  // response.completed always carries usage

  // What the response objects report back (deepseek-recipe's ResponsesEcho).
  OrderedJson echo;
  echo["instructions"] = instructions.empty() ? OrderedJson(nullptr) : OrderedJson(instructions);
  echo["max_output_tokens"] = max_output_tokens ? OrderedJson(*max_output_tokens) : OrderedJson(nullptr);
  echo["parallel_tool_calls"] = parallel;
  echo["reasoning"] = {{"effort", body.contains("reasoning") && body["reasoning"].is_object() &&
                                          body["reasoning"].contains("effort")
                                      ? body["reasoning"]["effort"]
                                      : OrderedJson(nullptr)},
                       {"summary", nullptr}};
  echo["temperature"] = temperature ? *temperature : 1.0;
  echo["text"] = body.contains("text") && body["text"].is_object() && body["text"].contains("format")
                     ? OrderedJson{{"format", body["text"]["format"]}}
                     : OrderedJson{{"format", {{"type", "text"}}}};
  echo["tool_choice"] = body.contains("tool_choice") && !body["tool_choice"].is_null() ? body["tool_choice"]
                                                                                       : OrderedJson("auto");
  OrderedJson tools = OrderedJson::array();
  if (body.contains("tools") && body["tools"].is_array()) {
    for (const OrderedJson& t : body["tools"]) {
      tools.push_back({{"type", "function"},
                       {"name", t["name"]},
                       {"description", t.contains("description") ? t["description"] : OrderedJson(nullptr)},
                       {"parameters", t.contains("parameters") ? t["parameters"] : OrderedJson(nullptr)},
                       {"strict", t.contains("strict") ? t["strict"] : OrderedJson(nullptr)}});
    }
  }
  echo["tools"] = std::move(tools);
  echo["top_p"] = top_p ? *top_p : 1.0;
  out->responses_echo = std::move(echo);
  return std::nullopt;
}

namespace {

OrderedJson usage_json(const Usage& u) {
  OrderedJson usage;
  usage["input_tokens"] = u.prompt_tokens;
  // cache_write_tokens (required by the SDK's ResponseUsage): the prompt tokens this request
  // computed, which the prefix cache stores for the next turn.
  usage["input_tokens_details"] = {{"cache_write_tokens", u.prompt_tokens - u.cached_tokens},
                                   {"cached_tokens", u.cached_tokens}};
  usage["output_tokens"] = u.completion_tokens;
  usage["output_tokens_details"] = {{"reasoning_tokens", u.reasoning_tokens}};
  usage["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  return usage;
}

OrderedJson reasoning_item(const std::string& id, const std::string& text, const char* status) {
  OrderedJson item;
  item["id"] = id;
  item["type"] = "reasoning";
  item["summary"] = OrderedJson::array();
  item["content"] = OrderedJson::array();
  if (!text.empty() || std::string_view(status) == "completed")
    item["content"].push_back({{"type", "reasoning_text"}, {"text", text}});
  item["encrypted_content"] = text;  // not encrypted: lets stateless clients return the text
  item["status"] = status;
  return item;
}

OrderedJson output_text_part(const std::string& text, std::span<const TokenLogprob> logprobs = {}) {
  return {{"type", "output_text"},
          {"text", text},
          {"annotations", OrderedJson::array()},
          {"logprobs", token_logprob_entries(logprobs)}};
}

OrderedJson message_item(const std::string& id, const std::string& text, const char* status, bool with_part,
                         std::span<const TokenLogprob> logprobs = {}) {
  OrderedJson item;
  item["id"] = id;
  item["type"] = "message";
  item["role"] = "assistant";
  item["status"] = status;
  item["content"] = OrderedJson::array();
  if (with_part) item["content"].push_back(output_text_part(text, logprobs));
  return item;
}

OrderedJson function_call_item(const std::string& id, const ToolCall& call, const char* status, bool with_arguments) {
  OrderedJson item;
  item["id"] = id;
  item["type"] = "function_call";
  item["call_id"] = call.id;
  item["name"] = call.name;
  item["arguments"] = with_arguments ? call.arguments : "";
  item["status"] = status;
  return item;
}

// The Response object; `output` is given (the stream built it item by item).
OrderedJson response_json(const Completion& c, OrderedJson output, const char* status) {
  OrderedJson r;
  r["id"] = c.id;
  r["object"] = "response";
  r["created_at"] = c.created;
  r["status"] = status;
  r["error"] = nullptr;
  r["incomplete_details"] = nullptr;
  if (std::string_view(status) == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  const OrderedJson& echo = c.responses_echo;
  auto echoed = [&](const char* key, OrderedJson fallback) {
    return echo.is_object() && echo.contains(key) ? echo[key] : fallback;
  };
  r["instructions"] = echoed("instructions", nullptr);
  r["max_output_tokens"] = echoed("max_output_tokens", nullptr);
  r["model"] = c.model;
  r["output"] = std::move(output);
  r["parallel_tool_calls"] = echoed("parallel_tool_calls", true);
  r["previous_response_id"] = nullptr;
  r["reasoning"] = echoed("reasoning", {{"effort", nullptr}, {"summary", nullptr}});
  r["store"] = false;
  r["temperature"] = echoed("temperature", 1.0);
  r["text"] = echoed("text", {{"format", {{"type", "text"}}}});
  r["tool_choice"] = echoed("tool_choice", "auto");
  r["tools"] = echoed("tools", OrderedJson::array());
  r["top_p"] = echoed("top_p", 1.0);
  r["truncation"] = "disabled";
  if (std::string_view(status) != "in_progress") r["usage"] = usage_json(c.usage);
  return r;
}

const char* final_status(const Completion& c) { return c.finish == FinishKind::kLength ? "incomplete" : "completed"; }

}  // namespace

std::string render_response(const Completion& c) {
  // The items the stream would have sent (an empty answer has none), the last one carrying the
  // response's status when max_output_tokens cut it.
  const char* status = final_status(c);
  const size_t n = (c.reasoning.empty() ? 0 : 1) + (c.content.empty() ? 0 : 1) + c.tool_calls.size();
  size_t i = 0;
  auto item_status = [&] { return ++i == n ? status : "completed"; };
  OrderedJson output = OrderedJson::array();
  if (!c.reasoning.empty()) output.push_back(reasoning_item(random_id("rs_"), c.reasoning, item_status()));
  if (!c.content.empty())
    output.push_back(message_item(random_id("msg_"), c.content, item_status(), true, c.logprobs));
  for (const ToolCall& call : c.tool_calls)
    output.push_back(function_call_item(random_id("fc_"), call, item_status(), true));
  return to_wire(response_json(c, std::move(output), status));
}

// ---- Streaming.

void ResponsesStream::event(const char* type, OrderedJson payload) {
  OrderedJson e;
  e["type"] = type;
  e["sequence_number"] = sequence_++;
  for (auto it = payload.begin(); it != payload.end(); ++it) e[it.key()] = std::move(it.value());
  out_ += sse_event(type, to_wire(e));
}

void ResponsesStream::on_start(const Completion& header) {
  header_ = header;
  event("response.created", {{"response", response_json(header_, OrderedJson::array(), "in_progress")}});
  event("response.in_progress", {{"response", response_json(header_, OrderedJson::array(), "in_progress")}});
}

void ResponsesStream::close_open_item(const char* status) {
  if (open_ == Open::kFunctionCall) {
    function_call_["status"] = status;
    event("response.output_item.done", {{"output_index", output_index_}, {"item", function_call_}});
    items_.push_back(std::move(function_call_));
  } else if (open_ == Open::kReasoning) {
    const OrderedJson part = {{"type", "reasoning_text"}, {"text", text_}};
    event("response.reasoning_text.done",
          {{"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0}, {"text", text_}});
    event("response.content_part.done",
          {{"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0}, {"part", part}});
    OrderedJson item = reasoning_item(item_id_, text_, status);
    event("response.output_item.done", {{"output_index", output_index_}, {"item", item}});
    items_.push_back(std::move(item));
  } else if (open_ == Open::kMessage) {
    event("response.output_text.done", {{"item_id", item_id_},
                                        {"output_index", output_index_},
                                        {"content_index", 0},
                                        {"text", text_},
                                        {"logprobs", token_logprob_entries(logprobs_, /*with_bytes=*/false)}});
    event("response.content_part.done", {{"item_id", item_id_},
                                         {"output_index", output_index_},
                                         {"content_index", 0},
                                         {"part", output_text_part(text_, logprobs_)}});
    OrderedJson item = message_item(item_id_, text_, status, true, logprobs_);
    event("response.output_item.done", {{"output_index", output_index_}, {"item", item}});
    items_.push_back(std::move(item));
  }
  open_ = Open::kNone;
  text_.clear();
  logprobs_.clear();
}

void ResponsesStream::on_reasoning(std::string_view delta) {
  if (open_ != Open::kReasoning) {
    close_open_item();
    open_ = Open::kReasoning;
    item_id_ = random_id("rs_");
    ++output_index_;
    event("response.output_item.added",
          {{"output_index", output_index_}, {"item", reasoning_item(item_id_, "", "in_progress")}});
    event("response.content_part.added", {{"item_id", item_id_},
                                          {"output_index", output_index_},
                                          {"content_index", 0},
                                          {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
  }
  text_ += delta;
  event("response.reasoning_text.delta",
        {{"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0}, {"delta", std::string(delta)}});
}

void ResponsesStream::on_content(std::string_view delta, std::span<const TokenLogprob> logprobs) {
  if (open_ != Open::kMessage) {
    close_open_item();
    open_ = Open::kMessage;
    item_id_ = random_id("msg_");
    ++output_index_;
    event("response.output_item.added",
          {{"output_index", output_index_}, {"item", message_item(item_id_, "", "in_progress", false)}});
    event("response.content_part.added",
          {{"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0}, {"part", output_text_part("")}});
  }
  text_ += delta;
  logprobs_.insert(logprobs_.end(), logprobs.begin(), logprobs.end());
  event("response.output_text.delta", {{"item_id", item_id_},
                                       {"output_index", output_index_},
                                       {"content_index", 0},
                                       {"delta", std::string(delta)},
                                       {"logprobs", token_logprob_entries(logprobs, /*with_bytes=*/false)}});
}

void ResponsesStream::on_tool_call(size_t index, const ToolCall& call) {
  close_open_item();
  const std::string id = random_id("fc_");
  ++output_index_;
  event("response.output_item.added",
        {{"output_index", output_index_}, {"item", function_call_item(id, call, "in_progress", false)}});
  event("response.function_call_arguments.delta",
        {{"item_id", id}, {"output_index", output_index_}, {"delta", call.arguments}});
  event("response.function_call_arguments.done",
        {{"item_id", id}, {"output_index", output_index_}, {"name", call.name}, {"arguments", call.arguments}});
  // Its output_item.done waits for the next item or the end: the last item of a turn cut by
  // max_output_tokens is "incomplete" (as deepseek-recipe reports it).
  open_ = Open::kFunctionCall;
  function_call_ = function_call_item(id, call, "completed", true);
}

void ResponsesStream::on_finish(const Completion& done) {
  const char* status = final_status(done);
  close_open_item(status);  // "incomplete" or "completed", like the response
  const char* type = std::string_view(status) == "incomplete" ? "response.incomplete" : "response.completed";
  event(type, {{"response", response_json(done, items_, status)}});
}

void ResponsesStream::on_error(const ApiError& error) {
  event("error", {{"code", error.openai_code() ? error.openai_code() : error.openai_type()},
                  {"message", error.message},
                  {"param", error.param.empty() ? OrderedJson(nullptr) : OrderedJson(error.param)}});
  OrderedJson failed = response_json(header_, items_, "failed");
  failed["error"] = {{"code", "server_error"}, {"message", error.message}};
  event("response.failed", {{"response", std::move(failed)}});
}

}  // namespace cedar::serve
