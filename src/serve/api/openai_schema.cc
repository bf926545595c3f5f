#include "serve/api/openai_schema.h"

#include "runtime/engine.h"
#include "serve/api/chat_prompt.h"
#include "serve/api/logprobs_json.h"
#include "serve/api/output_constraint.h"
#include "serve/http/sse.h"
#include "serve/api/strict_tools.h"

namespace cedar::serve {
namespace {

constexpr int64_t kMaxTokensField = 1 << 30;  // a sanity bound; the engine's context decides for real
// deepseek-recipe's ConversionOptions() bound on max_tokens (thinking or not): larger is a 400 there.
constexpr int64_t kRecipeMaxTokens = 393216;

// choices[].logprobs of Chat Completions (and of its chunks).
OrderedJson chat_logprobs_json(std::span<const TokenLogprob> tokens) {
  return {{"content", token_logprob_entries(tokens)}, {"refusal", nullptr}};
}

// Fields every OpenAI generation endpoint shares: sampling, stop strings, streaming, and the options
// cedar cannot honour (answered with a 400 that says so, rather than silently ignored).
SchemaError parse_common_generation_fields(const OrderedJson& body, SamplingOptions* sampling,
                                           StreamOptions* stream) {
  std::optional<int64_t> max_tokens, max_completion_tokens, n, seed;
  CEDAR_SCHEMA_TRY(read_int(body, "max_tokens", "", 1, kRecipeMaxTokens, &max_tokens));
  CEDAR_SCHEMA_TRY(read_int(body, "max_completion_tokens", "", 1, kMaxTokensField, &max_completion_tokens));
  if (max_completion_tokens) {
    sampling->max_tokens = static_cast<int>(*max_completion_tokens);
  } else if (max_tokens) {
    sampling->max_tokens = static_cast<int>(*max_tokens);
  }
  std::optional<double> temperature, top_p, presence, frequency;
  CEDAR_SCHEMA_TRY(read_number(body, "temperature", "", 0.0, 2.0, &temperature));
  if (temperature) sampling->temperature = static_cast<float>(*temperature);
  // V4.1's reference sampler has no nucleus cut; top_p is accepted for compatibility (agents send the
  // model card's 0.95 or 1.0) and documented as having no effect.
  CEDAR_SCHEMA_TRY(read_number(body, "top_p", "", 0.0, 1.0, &top_p));
  CEDAR_SCHEMA_TRY(read_number(body, "presence_penalty", "", -2.0, 2.0, &presence));
  CEDAR_SCHEMA_TRY(read_number(body, "frequency_penalty", "", -2.0, 2.0, &frequency));
  if ((presence && *presence != 0) || (frequency && *frequency != 0))
    return invalid_request("presence_penalty / frequency_penalty are not supported by cedar (only 0)",
                           presence && *presence != 0 ? "presence_penalty" : "frequency_penalty");
  CEDAR_SCHEMA_TRY(read_int(body, "n", "", 1, 1, &n));  // one choice per request
  CEDAR_SCHEMA_TRY(read_int(body, "seed", "", INT64_MIN, INT64_MAX, &seed));
  if (seed) sampling->seed = static_cast<uint64_t>(*seed);
  if (body.contains("stop")) CEDAR_SCHEMA_TRY(read_stop(body["stop"], "stop", 4, &sampling->stop));
  if (body.contains("logit_bias") && !body["logit_bias"].is_null() &&
      !(body["logit_bias"].is_object() && body["logit_bias"].empty()))
    return invalid_request("logit_bias is not supported by cedar", "logit_bias");
  CEDAR_SCHEMA_TRY(read_bool(body, "stream", "", &stream->stream));
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const OrderedJson& so = body["stream_options"];
    if (!so.is_object()) return invalid_request("'stream_options' must be an object", "stream_options");
    CEDAR_SCHEMA_TRY(read_bool(so, "include_usage", "stream_options", &stream->include_usage));
  }
  return std::nullopt;
}

// Chat Completions: "logprobs": bool, "top_logprobs": 0..20 (which needs logprobs true, as OpenAI).
SchemaError parse_chat_logprobs(const OrderedJson& body, SamplingOptions* sampling) {
  CEDAR_SCHEMA_TRY(read_bool(body, "logprobs", "", &sampling->logprobs));
  std::optional<int64_t> top;
  CEDAR_SCHEMA_TRY(read_int(body, "top_logprobs", "", 0, runtime::kMaxTopLogprobs, &top));
  if (top && !sampling->logprobs)
    return invalid_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  sampling->top_logprobs = static_cast<int>(top.value_or(0));
  return std::nullopt;
}

// Legacy Completions: "logprobs": N (0..20) reports every token and its N most probable
// alternatives; null means none.
SchemaError parse_legacy_logprobs(const OrderedJson& body, SamplingOptions* sampling) {
  auto it = body.find("logprobs");
  if (it != body.end() && it->is_boolean() && !it->get<bool>()) return std::nullopt;  // false: none
  std::optional<int64_t> top;
  CEDAR_SCHEMA_TRY(read_int(body, "logprobs", "", 0, runtime::kMaxTopLogprobs, &top));
  sampling->logprobs = top.has_value();
  sampling->top_logprobs = static_cast<int>(top.value_or(0));
  return std::nullopt;
}

SchemaError parse_tool_call(const OrderedJson& tc, const std::string& path, ToolCall* out) {
  if (!tc.is_object()) return invalid_request("'" + path + "' must be an object", path);
  std::string type = "function";
  CEDAR_SCHEMA_TRY(read_string(tc, "type", path, &type));
  if (type != "function")
    return invalid_request("'" + field_path(path, "type") + "' must be \"function\"", field_path(path, "type"));
  CEDAR_SCHEMA_TRY(read_string(tc, "id", path, &out->id, /*required=*/true));
  const std::string fpath = field_path(path, "function");
  auto fn = tc.find("function");
  if (fn == tc.end() || !fn->is_object()) return invalid_request("'" + fpath + "' must be an object", fpath);
  CEDAR_SCHEMA_TRY(read_string(*fn, "name", fpath, &out->name, /*required=*/true));
  CEDAR_SCHEMA_TRY(read_string(*fn, "arguments", fpath, &out->arguments));
  return check_history_arguments(out->arguments, field_path(fpath, "arguments"));
}

SchemaError parse_message(const OrderedJson& m, const std::string& path, Message* out) {
  if (!m.is_object()) return invalid_request("'" + path + "' must be an object", path);
  std::string role;
  CEDAR_SCHEMA_TRY(read_string(m, "role", path, &role, /*required=*/true));
  const OrderedJson null_content;
  const OrderedJson& content = m.contains("content") ? m["content"] : null_content;
  const std::string cpath = field_path(path, "content");
  if (role == "system" || role == "developer") {
    out->role = Role::kSystem;
    return read_text_content(content, cpath, {"text"}, &out->content);
  }
  if (role == "user") {
    out->role = Role::kUser;
    return read_user_content(content, cpath, {"text"}, {"image_url"}, out);
  }
  if (role == "tool") {
    out->role = Role::kTool;
    CEDAR_SCHEMA_TRY(read_string(m, "tool_call_id", path, &out->tool_call_id, /*required=*/true));
    return read_text_content(content, cpath, {"text"}, &out->content);
  }
  if (role == "assistant") {
    out->role = Role::kAssistant;
    CEDAR_SCHEMA_TRY(read_text_content(content, cpath, {"text"}, &out->content));
    // DeepSeek's field for the thinking text of earlier turns ("reasoning" from some gateways).
    CEDAR_SCHEMA_TRY(read_string(m, "reasoning_content", path, &out->reasoning));
    if (out->reasoning.empty()) CEDAR_SCHEMA_TRY(read_string(m, "reasoning", path, &out->reasoning));
    CEDAR_SCHEMA_TRY(read_bool(m, "prefix", path, &out->prefix));
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const OrderedJson& calls = m["tool_calls"];
      const std::string tpath = field_path(path, "tool_calls");
      if (!calls.is_array()) return invalid_request("'" + tpath + "' must be an array", tpath);
      out->tool_calls.resize(calls.size());
      for (size_t i = 0; i < calls.size(); ++i)
        CEDAR_SCHEMA_TRY(parse_tool_call(calls[i], field_path(tpath, i), &out->tool_calls[i]));
    }
    return std::nullopt;
  }
  return invalid_request("'" + field_path(path, "role") + "' is \"" + role +
                             "\"; expected system, developer, user, assistant or tool",
                         field_path(path, "role"));
}

// DeepSeek's `prefix: true` continues the last message, which must be an assistant message, in a
// conversation without tools or tool calls (deepseek-recipe refuses the rest with 400). Checked on
// the declared tools, before tool_choice "none" removes them, as deepseek-recipe checks them.
SchemaError check_prefix(const ChatRequest& request) {
  bool continued = false;
  for (size_t i = 0; i < request.messages.size(); ++i) {
    const Message& m = request.messages[i];
    if (!m.prefix) continue;
    if (i + 1 != request.messages.size()) {
      const std::string path = field_path(field_path("messages", i), "prefix");
      return invalid_request("'" + path + "' is true, but only the last message can be continued", path);
    }
    continued = true;
  }
  if (!continued) return std::nullopt;
  const std::string path = field_path(field_path("messages", request.messages.size() - 1), "prefix");
  bool calls = !request.tools.empty();
  for (const Message& m : request.messages) calls = calls || !m.tool_calls.empty();
  if (calls)
    return invalid_request("'" + path + "' is true in a conversation with tools or tool calls: a continued assistant "
                               "message cannot call tools (as DeepSeek's API answers); drop 'prefix' or the tools",
                           path);
  return std::nullopt;
}

SchemaError parse_tools(const OrderedJson& tools, std::vector<OrderedJson>* out) {
  if (tools.is_null()) return std::nullopt;
  if (!tools.is_array()) return invalid_request("'tools' must be an array", "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string path = field_path("tools", i);
    const OrderedJson& t = tools[i];
    if (!t.is_object()) return invalid_request("'" + path + "' must be an object", path);
    std::string type;
    CEDAR_SCHEMA_TRY(read_string(t, "type", path, &type, /*required=*/true));
    if (type != "function")
      return invalid_request("'" + field_path(path, "type") + "' is \"" + type + "\"; cedar serves function tools only",
                             field_path(path, "type"));
    const std::string fpath = field_path(path, "function");
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) return invalid_request("'" + fpath + "' must be an object", fpath);
    std::string name, description;
    CEDAR_SCHEMA_TRY(read_string(*fn, "name", fpath, &name, /*required=*/true));
    CEDAR_SCHEMA_TRY(check_tool_name(name, field_path(fpath, "name")));
    CEDAR_SCHEMA_TRY(read_string(*fn, "description", fpath, &description));
    if (fn->contains("parameters") && !(*fn)["parameters"].is_object() && !(*fn)["parameters"].is_null())
      return invalid_request("'" + field_path(fpath, "parameters") + "' must be a JSON schema object",
                             field_path(fpath, "parameters"));
    out->push_back(*fn);
  }
  return std::nullopt;
}

// tool_choice: "auto" (the default) keeps the tools; "none" leaves them out of the prompt;
// "required" and a named function force a tool call (constrained decoding, output_constraint.h).
SchemaError apply_tool_choice(const OrderedJson& body, ChatRequest* out) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string() && *it == "auto") return std::nullopt;
  if (it->is_string() && *it == "none") {
    out->tools.clear();
    return std::nullopt;
  }
  if (it->is_string() && *it == "required") return require_tool_call("tool_choice", out);
  if (it->is_object() && it->value("type", "") == "function" && it->contains("function") &&
      (*it)["function"].is_object() && (*it)["function"].contains("name") && (*it)["function"]["name"].is_string())
    return choose_named_tool((*it)["function"]["name"].get<std::string>(), "tool_choice.function.name", out);
  return invalid_request(
      "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
      "tool_choice");
}

// response_format: text, json_object, json_schema (strict or not) or regex {"type": "regex",
// "regex": PATTERN} (deepseek-recipe's extension). The prompt shows json formats; the answer is
// constrained to them (output_constraint.h).
SchemaError parse_response_format(const OrderedJson& body, ChatRequest* out) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) return invalid_request("'response_format' must be an object", "response_format");
  std::string type;
  CEDAR_SCHEMA_TRY(read_string(*it, "type", "response_format", &type, /*required=*/true));
  if (type == "text") return std::nullopt;  // the default: nothing to add to the prompt
  if (type == "regex") {
    std::string pattern;
    CEDAR_SCHEMA_TRY(read_string(*it, "regex", "response_format", &pattern, /*required=*/true));
    out->answer_constraint = AnswerConstraint{true, pattern, false, "response_format.regex"};
    return std::nullopt;
  }
  if (type != "json_object" && type != "json_schema")
    return invalid_request("'response_format.type' must be text, json_object, json_schema or regex",
                           "response_format.type");
  if (type == "json_object") {
    out->response_format = json_object_format();
    out->answer_constraint = AnswerConstraint{};
    out->parse_json_output = true;
    return std::nullopt;
  }
  if (!it->contains("json_schema") || !(*it)["json_schema"].is_object())
    return invalid_request("'response_format.json_schema' must be an object", "response_format.json_schema");
  const OrderedJson& js = (*it)["json_schema"];
  if (!js.contains("schema") || !js["schema"].is_object())
    return invalid_request("'response_format.json_schema.schema' must be a JSON schema object",
                           "response_format.json_schema.schema");
  bool strict = false;
  CEDAR_SCHEMA_TRY(read_bool(js, "strict", "response_format.json_schema", &strict));
  out->response_format = js["schema"];  // the prompt shows the schema itself, as deepseek-recipe renders it
  OrderedJson enforced = js["schema"];
  if (strict) CEDAR_SCHEMA_TRY(strict_json_schema(js["schema"], "response_format.json_schema.schema", &enforced));
  out->answer_constraint = AnswerConstraint{false, enforced.dump(), strict, "response_format.json_schema.schema"};
  return std::nullopt;
}

}  // namespace

SchemaError parse_chat_completion_request(const OrderedJson& body, ChatRequest* out) {
  CEDAR_SCHEMA_TRY(read_string(body, "model", "", &out->model));
  auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array() || messages->empty())
    return invalid_request("'messages' must be a non-empty array", "messages");
  out->messages.resize(messages->size());
  for (size_t i = 0; i < messages->size(); ++i)
    CEDAR_SCHEMA_TRY(parse_message((*messages)[i], field_path("messages", i), &out->messages[i]));
  if (body.contains("tools")) CEDAR_SCHEMA_TRY(parse_tools(body["tools"], &out->tools));
  CEDAR_SCHEMA_TRY(check_prefix(*out));
  CEDAR_SCHEMA_TRY(apply_strict_tools(&out->tools, "tools"));
  CEDAR_SCHEMA_TRY(apply_tool_choice(body, out));
  CEDAR_SCHEMA_TRY(parse_response_format(body, out));
  if (out->messages.back().prefix && out->parse_json_output)
    return invalid_request("a json_object response format cannot continue an assistant message ('prefix': true), as "
                           "DeepSeek's API answers; drop one of them",
                           "response_format");
  bool parallel_tool_calls = true;  // accepted; V4.1 decides how many invokes one block holds
  CEDAR_SCHEMA_TRY(read_bool(body, "parallel_tool_calls", "", &parallel_tool_calls));
  // DeepSeek's API switch {"thinking": {"type": "enabled" | "disabled"}}, then reasoning_effort.
  if (body.contains("thinking") && !body["thinking"].is_null()) {
    const OrderedJson& t = body["thinking"];
    std::string type;
    if (!t.is_object()) return invalid_request("'thinking' must be an object {\"type\": ...}", "thinking");
    CEDAR_SCHEMA_TRY(read_string(t, "type", "thinking", &type, /*required=*/true));
    if (type != "enabled" && type != "disabled")
      return invalid_request("'thinking.type' must be \"enabled\" or \"disabled\"", "thinking.type");
    out->reasoning.thinking = (type == "enabled");
  }
  if (body.contains("reasoning_effort")) {
    const std::optional<bool> explicit_thinking = out->reasoning.thinking;
    CEDAR_SCHEMA_TRY(read_effort(body["reasoning_effort"], "reasoning_effort", &out->reasoning));
    if (explicit_thinking.has_value() && !*explicit_thinking) out->reasoning.thinking = false;
  }
  CEDAR_SCHEMA_TRY(parse_chat_logprobs(body, &out->sampling));
  return parse_common_generation_fields(body, &out->sampling, &out->stream);
}

SchemaError parse_completion_request(const OrderedJson& body, CompletionRequest* out) {
  CEDAR_SCHEMA_TRY(read_string(body, "model", "", &out->model));
  auto prompt = body.find("prompt");
  if (prompt == body.end()) return invalid_request("'prompt' is required", "prompt");
  if (prompt->is_string()) {
    out->prompt = prompt->get<std::string>();
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    out->prompt = (*prompt)[0].get<std::string>();
  } else {
    return invalid_request("'prompt' must be a string (or an array of exactly one string)", "prompt");
  }
  if (out->prompt.empty()) return invalid_request("'prompt' is empty", "prompt");
  bool echo = false;
  CEDAR_SCHEMA_TRY(read_bool(body, "echo", "", &echo));
  if (echo) return invalid_request("'echo' is not supported by cedar", "echo");
  std::optional<int64_t> best_of;
  CEDAR_SCHEMA_TRY(read_int(body, "best_of", "", 1, 1, &best_of));
  if (body.contains("suffix") && !body["suffix"].is_null())
    return invalid_request("'suffix' (fill-in-the-middle) is not supported by cedar", "suffix");
  CEDAR_SCHEMA_TRY(parse_legacy_logprobs(body, &out->sampling));
  return parse_common_generation_fields(body, &out->sampling, &out->stream);
}

const char* openai_finish_reason(FinishKind finish) {
  switch (finish) {
    case FinishKind::kLength: return "length";
    case FinishKind::kToolCalls: return "tool_calls";
    default: return "stop";
  }
}

OrderedJson openai_usage(const Usage& u) {
  OrderedJson usage;
  usage["prompt_tokens"] = u.prompt_tokens;
  usage["completion_tokens"] = u.completion_tokens;
  usage["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  usage["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
  usage["completion_tokens_details"] = {{"reasoning_tokens", u.reasoning_tokens}};
  return usage;
}

namespace {

OrderedJson tool_call_json(const ToolCall& call) {
  return {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

}  // namespace

std::string render_chat_completion(const Completion& c) {
  OrderedJson message;
  message["role"] = "assistant";
  // OpenAI gives content null for a pure tool-call turn.
  if (c.content.empty() && !c.tool_calls.empty()) {
    message["content"] = nullptr;
  } else {
    message["content"] = c.content;
  }
  if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
  if (!c.tool_calls.empty()) {
    message["tool_calls"] = OrderedJson::array();
    for (const ToolCall& call : c.tool_calls) message["tool_calls"].push_back(tool_call_json(call));
  }
  OrderedJson choice;
  choice["index"] = 0;
  choice["message"] = std::move(message);
  choice["logprobs"] = c.has_logprobs ? chat_logprobs_json(c.logprobs) : OrderedJson(nullptr);
  choice["finish_reason"] = openai_finish_reason(c.finish);
  OrderedJson body;
  body["id"] = c.id;
  body["object"] = "chat.completion";
  body["created"] = c.created;
  body["model"] = c.model;
  body["choices"] = OrderedJson::array({std::move(choice)});
  body["usage"] = openai_usage(c.usage);
  body["system_fingerprint"] = "cedar";
  return to_wire(body);
}

std::string render_text_completion(const Completion& c) {
  OrderedJson choice;
  choice["index"] = 0;
  choice["text"] = c.content;
  choice["logprobs"] = c.has_logprobs ? legacy_logprobs(c.logprobs) : OrderedJson(nullptr);
  choice["finish_reason"] = openai_finish_reason(c.finish);
  OrderedJson body;
  body["id"] = c.id;
  body["object"] = "text_completion";
  body["created"] = c.created;
  body["model"] = c.model;
  body["choices"] = OrderedJson::array({std::move(choice)});
  body["usage"] = openai_usage(c.usage);
  return to_wire(body);
}

namespace {

OrderedJson openai_error_json(const ApiError& e) {
  OrderedJson err;
  err["message"] = e.message;
  err["type"] = e.openai_type();
  err["param"] = e.param.empty() ? OrderedJson(nullptr) : OrderedJson(e.param);
  err["code"] = e.openai_code() ? OrderedJson(e.openai_code()) : OrderedJson(nullptr);
  return {{"error", std::move(err)}};
}

}  // namespace

std::string render_openai_error(const ApiError& e) { return to_wire(openai_error_json(e)); }

std::string render_model_list(const std::vector<std::string>& model_ids, int64_t created) {
  OrderedJson data = OrderedJson::array();
  for (const std::string& id : model_ids)
    data.push_back({{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "cedar"}});
  return to_wire({{"object", "list"}, {"data", std::move(data)}});
}

ModelLookup render_model_lookup(const std::vector<std::string>& model_ids, const std::string& requested,
                                int64_t created) {
  for (const std::string& id : model_ids)
    if (id == requested)
      return {200, to_wire({{"id", id}, {"object", "model"}, {"created", created}, {"owned_by", "cedar"}})};
  std::string served;
  for (const std::string& id : model_ids) served += (served.empty() ? "'" : ", '") + id + "'";
  OrderedJson err = {{"message", "The model '" + requested + "' does not exist; this server serves " + served},
                     {"type", "invalid_request_error"},
                     {"param", "model"},
                     {"code", "model_not_found"}};
  return {404, to_wire({{"error", std::move(err)}})};
}

std::string render_health(const std::string& model_id, int waiting, int running) {
  return to_wire({{"status", "ok"}, {"model", model_id}, {"queue", {{"waiting", waiting}, {"running", running}}}});
}

// ---- Chat Completions stream.

void ChatCompletionStream::emit_delta(OrderedJson delta, const char* finish_reason,
                                      std::optional<std::span<const TokenLogprob>> logprobs) {
  OrderedJson choice;
  choice["index"] = 0;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = logprobs ? chat_logprobs_json(*logprobs) : OrderedJson(nullptr);
  choice["finish_reason"] = finish_reason ? OrderedJson(finish_reason) : OrderedJson(nullptr);
  OrderedJson chunk;
  chunk["id"] = header_.id;
  chunk["object"] = "chat.completion.chunk";
  chunk["created"] = header_.created;
  chunk["model"] = header_.model;
  chunk["system_fingerprint"] = "cedar";
  chunk["choices"] = OrderedJson::array({std::move(choice)});
  out_ += sse_data(to_wire(chunk));
}

void ChatCompletionStream::on_start(const Completion& header) {
  header_ = header;
  emit_delta({{"role", "assistant"}, {"content", ""}}, nullptr);
}

void ChatCompletionStream::on_reasoning(std::string_view delta) {
  emit_delta({{"reasoning_content", std::string(delta)}}, nullptr);
}

void ChatCompletionStream::on_content(std::string_view delta, std::span<const TokenLogprob> logprobs) {
  std::optional<std::span<const TokenLogprob>> reported;
  if (header_.has_logprobs) reported = logprobs;
  emit_delta({{"content", std::string(delta)}}, nullptr, reported);
}

void ChatCompletionStream::on_tool_call(size_t index, const ToolCall& call) {
  OrderedJson tc = tool_call_json(call);
  tc["index"] = index;
  emit_delta({{"tool_calls", OrderedJson::array({std::move(tc)})}}, nullptr);
}

void ChatCompletionStream::on_finish(const Completion& done) {
  emit_delta(OrderedJson::object(), openai_finish_reason(done.finish));
  if (include_usage_) {
    OrderedJson chunk;
    chunk["id"] = header_.id;
    chunk["object"] = "chat.completion.chunk";
    chunk["created"] = header_.created;
    chunk["model"] = header_.model;
    chunk["system_fingerprint"] = "cedar";
    chunk["choices"] = OrderedJson::array();
    chunk["usage"] = openai_usage(done.usage);
    out_ += sse_data(to_wire(chunk));
  }
  out_ += sse_data("[DONE]");
}

void ChatCompletionStream::on_error(const ApiError& error) {
  out_ += sse_data(to_wire(openai_error_json(error)));
  out_ += sse_data("[DONE]");
}

// ---- Legacy Completions stream.

void TextCompletionStream::on_content(std::string_view delta, std::span<const TokenLogprob> logprobs) {
  OrderedJson choice;
  choice["index"] = 0;
  choice["text"] = std::string(delta);
  choice["logprobs"] = header_.has_logprobs ? legacy_logprobs(logprobs) : OrderedJson(nullptr);
  choice["finish_reason"] = nullptr;
  OrderedJson chunk;
  chunk["id"] = header_.id;
  chunk["object"] = "text_completion";
  chunk["created"] = header_.created;
  chunk["model"] = header_.model;
  chunk["choices"] = OrderedJson::array({std::move(choice)});
  out_ += sse_data(to_wire(chunk));
}

void TextCompletionStream::on_finish(const Completion& done) {
  OrderedJson choice;
  choice["index"] = 0;
  choice["text"] = "";
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = openai_finish_reason(done.finish);
  OrderedJson chunk;
  chunk["id"] = header_.id;
  chunk["object"] = "text_completion";
  chunk["created"] = header_.created;
  chunk["model"] = header_.model;
  chunk["choices"] = OrderedJson::array({std::move(choice)});
  if (include_usage_) chunk["usage"] = openai_usage(done.usage);
  out_ += sse_data(to_wire(chunk));
  out_ += sse_data("[DONE]");
}

void TextCompletionStream::on_error(const ApiError& error) {
  out_ += sse_data(to_wire(openai_error_json(error)));
  out_ += sse_data("[DONE]");
}

}  // namespace cedar::serve
