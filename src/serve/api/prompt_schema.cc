#include "serve/api/prompt_schema.h"

#include "chat/chat_encoding.h"
#include "serve/api/json_body.h"
#include "serve/api/schema_util.h"

namespace cedar::serve {
namespace {

const char* role_name(Role role) {
  switch (role) {
    case Role::kSystem: return "system";
    case Role::kUser: return "user";
    case Role::kAssistant: return "assistant";
    case Role::kTool: return "tool";
  }
  return "user";
}

// The tool as the prompt shows it, whichever API declared it: deepseek-recipe renders exactly name,
// description ("" when absent) and parameters ({} when absent), in that order, and nothing else.
OrderedJson prompt_tool(const OrderedJson& fn) {
  OrderedJson out = OrderedJson::object();
  out["name"] = fn.contains("name") ? fn["name"] : OrderedJson("");
  const bool has_description = fn.contains("description") && fn["description"].is_string();
  out["description"] = has_description ? fn["description"] : OrderedJson("");
  const bool has_parameters = fn.contains("parameters") && fn["parameters"].is_object();
  out["parameters"] = has_parameters ? fn["parameters"] : OrderedJson::object();
  return out;
}

}  // namespace

OrderedJson encoder_messages(const std::vector<Message>& messages, const std::vector<OrderedJson>& tools,
                             const std::optional<OrderedJson>& response_format, bool continue_last) {
  OrderedJson out = OrderedJson::array();
  const bool needs_system_carrier = !tools.empty() || response_format.has_value();
  if (needs_system_carrier && (messages.empty() || messages.front().role != Role::kSystem))
    out.push_back({{"role", "system"}, {"content", ""}});
  for (const Message& m : messages) {
    OrderedJson msg;
    msg["role"] = role_name(m.role);
    msg["content"] = m.content_blocks.is_array() ? m.content_blocks : OrderedJson(m.content);
    if (m.role == Role::kAssistant) {
      if (m.model_text) msg[chat::kModelTextKey] = true;
      if (!m.reasoning.empty()) msg["reasoning_content"] = m.reasoning;
      if (!m.tool_calls.empty()) {
        OrderedJson calls = OrderedJson::array();
        for (const ToolCall& c : m.tool_calls)
          calls.push_back({{"id", c.id},
                           {"type", "function"},
                           {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        msg["tool_calls"] = std::move(calls);
      }
    }
    if (m.role == Role::kTool) msg["tool_call_id"] = m.tool_call_id;
    out.push_back(std::move(msg));
  }
  if (needs_system_carrier) {
    OrderedJson& carrier = out.front();
    if (!tools.empty()) {
      OrderedJson list = OrderedJson::array();
      for (const OrderedJson& fn : tools) list.push_back({{"type", "function"}, {"function", prompt_tool(fn)}});
      carrier["tools"] = std::move(list);
    }
    if (response_format) carrier["response_format"] = *response_format;
  }
  if (continue_last && !out.empty()) out.back()["wo_eos"] = true;
  return out;
}

bool same_arguments(const std::string& a, const std::string& b) {
  if (a == b) return true;
  if (json_nesting_depth(a) > kMaxJsonDepth || json_nesting_depth(b) > kMaxJsonDepth) return false;
  // Plain json (sorted keys) compares objects regardless of key order.
  const nlohmann::json ja = nlohmann::json::parse(a, nullptr, false), jb = nlohmann::json::parse(b, nullptr, false);
  return !ja.is_discarded() && !jb.is_discarded() && ja == jb;
}

OrderedJson arguments_object(const std::string& arguments) {
  OrderedJson parsed;
  if (parse_json_bounded(arguments, JsonLimits{}, &parsed, "the arguments")) return OrderedJson::object();
  return parsed.is_object() ? parsed : OrderedJson::object();
}

}  // namespace cedar::serve
