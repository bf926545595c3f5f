#include "chat/chat_encoding.h"

#include <algorithm>
#include <utility>

#include "chat/python_json.h"
#include "tokenizer/marker_tokens.h"

namespace cedar::chat {

using tokenizer::kAssistantMarker;
using tokenizer::kBos;
using tokenizer::kDsml;
using tokenizer::kEos;
using tokenizer::kImagePlaceholder;
using tokenizer::kLatestReminderMarker;
using tokenizer::kSystemMarker;
using tokenizer::kThinkEnd;
using tokenizer::kThinkStart;
using tokenizer::kUserMarker;
using tokenizer::TokenId;
using tokenizer::Tokenizer;

namespace {

using ojson = nlohmann::ordered_json;

// The tools section of the system prompt. {calls}/{invoke}/{parameter} are the format's DSML tag
// names; {schemas} is one JSON line per tool.
constexpr std::string_view kToolsTemplate =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<｜DSML｜{calls}>\" block like the following:\n\n"
    "<｜DSML｜{calls}>\n"
    "<｜DSML｜{invoke} name=\"$TOOL_NAME\">\n"
    "<｜DSML｜{parameter} name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜{parameter}>\n"
    "...\n"
    "</｜DSML｜{invoke}>\n"
    "<｜DSML｜{invoke} name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜{invoke}>\n"
    "</｜DSML｜{calls}>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "{schemas}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

constexpr std::string_view kResponseFormatPrefix =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// V4 "max" effort: a fixed paragraph at the very start of message 0.
constexpr std::string_view kV4MaxEffort =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

// Internal classification tasks a user message may carry ("task"), in the official order.
constexpr std::pair<std::string_view, std::string_view> kTasks[] = {
    {"action", "<｜action｜>"}, {"query", "<｜query｜>"},   {"authority", "<｜authority｜>"},
    {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

// Prompt text under construction, with the kind of every stretch (see SpanKind).
class Pieces {
 public:
  Pieces& text(std::string_view s) { return add(s, SpanKind::kText); }
  Pieces& special(std::string_view s) { return add(s, SpanKind::kSpecial); }
  Pieces& model_text(std::string_view s) { return add(s, SpanKind::kModelText); }
  // Template prose written by the encoder: the markers it names are the encoder's own tokens (the
  // official encoders put the tools template's DSML tags and <think> / </think> in special ranges).
  Pieces& templ(std::string_view s) {
    static constexpr std::string_view kMarkers[] = {kDsml, kThinkStart, kThinkEnd};
    while (!s.empty()) {
      size_t at = std::string_view::npos, len = 0;
      for (std::string_view m : kMarkers) {
        const size_t p = s.find(m);
        if (p < at) at = p, len = m.size();
      }
      if (at == std::string_view::npos) return text(s);
      text(s.substr(0, at));
      special(s.substr(at, len));
      s.remove_prefix(at + len);
    }
    return *this;
  }
  Pieces& append(const Pieces& o) {
    for (const PromptSpan& sp : o.spans_) add(std::string_view(o.text_).substr(sp.begin, sp.end - sp.begin), sp.kind);
    return *this;
  }
  bool empty() const { return text_.empty(); }
  void move_into(ChatPrompt* out) {
    out->text = std::move(text_);
    out->spans = std::move(spans_);
  }

 private:
  Pieces& add(std::string_view s, SpanKind kind) {
    if (s.empty()) return *this;
    const size_t at = text_.size();
    text_ += s;
    if (kind != SpanKind::kSpecial && !spans_.empty() && spans_.back().kind == kind) {
      spans_.back().end = text_.size();
    } else {
      spans_.push_back({at, text_.size(), kind});
    }
    return *this;
  }
  std::string text_;
  std::vector<PromptSpan> spans_;
};

std::string where(size_t index) { return "messages[" + std::to_string(index) + "]"; }

std::string get_role(const ojson& msg) {
  auto it = msg.find("role");
  if (it == msg.end() || it->is_null()) return "None";
  return it->is_string() ? it->get<std::string>() : python_json_dumps(*it);
}

// msg.get(key) with Python's None for a missing key.
const ojson& get(const ojson& msg, const char* key) {
  static const ojson kNull = nullptr;
  auto it = msg.find(key);
  return it == msg.end() ? kNull : *it;
}

// `value or ""` formatted with str.format.
Result<std::string> text_or_empty(const ojson& value, const std::string& what) {
  if (!python_truthy(value)) return std::string();
  return python_str(value, what);
}

// Marks the text block that stands for an image (see process_blocks).
constexpr const char* kImageBlockKey = "cedar_image_placeholder";

class Encoder {
 public:
  explicit Encoder(const ChatOptions& o) : opt_(o), v41_(o.format == PromptFormat::kV41) {}

  Result<ChatPrompt> run(const ojson& messages) {
    if (!messages.is_array()) return invalid_argument("messages must be a JSON array of message objects");
    std::vector<ojson> msgs;
    for (size_t i = 0; i < messages.size(); ++i) {
      if (!messages[i].is_object()) return invalid_argument(where(i) + " must be a JSON object");
      msgs.push_back(messages[i]);
    }
    ChatPrompt out;
    if (v41_) {
      CEDAR_RETURN_IF_ERROR(process_images(&msgs, &out.images));
    } else {
      CEDAR_RETURN_IF_ERROR(check_v4_content(msgs));
    }
    CEDAR_ASSIGN_OR_RETURN(msgs, merge_tool_messages(msgs));
    sort_tool_results(&msgs);
    bool drop = opt_.drop_thinking;
    for (const auto& m : msgs) {
      if (python_truthy(get(m, "tools"))) drop = false;
    }
    current_turn_ = current_turn_index(msgs);
    if (opt_.thinking_mode == ThinkingMode::kThinking && drop) msgs = drop_thinking_messages(msgs);
    Pieces prompt;
    if (opt_.add_bos) prompt.special(kBos);
    for (size_t i = 0; i < msgs.size(); ++i) {
      CEDAR_ASSIGN_OR_RETURN(Pieces part, render(i, msgs, drop));
      prompt.append(part);
    }
    prompt.move_into(&out);
    return out;
  }

 private:
  // --- preprocessing --------------------------------------------------------------------------

  Status check_v4_content(const std::vector<ojson>& msgs) {
    for (size_t i = 0; i < msgs.size(); ++i) {
      const ojson& c = get(msgs[i], "content");
      if (c.is_array() || c.is_object()) {
        return invalid_argument(where(i) + ".content: the V4 prompt format takes text content only");
      }
    }
    return {};
  }

  // Image blocks become the placeholder text; list content becomes content_blocks plus the
  // "\n\n"-joined text (the official process_image_messages).
  Status process_blocks(ojson* blocks, std::vector<std::string>* images, const std::string& w) {
    for (auto& block : *blocks) {
      if (!block.is_object()) continue;
      const std::string type = get(block, "type").is_string() ? block["type"].get<std::string>() : "";
      if (type == "image" || type == "image_url") {
        std::string source;
        if (type == "image_url") {
          const ojson& iu = get(block, "image_url");
          if (iu.is_string()) source = iu.get<std::string>();
          else if (iu.is_object() && get(iu, "url").is_string()) source = iu["url"].get<std::string>();
        } else {
          for (const char* key : {"source", "url", "data"}) {
            const ojson& v = get(block, key);
            if (python_truthy(v)) {
              source = v.is_string() ? v.get<std::string>() : python_json_dumps(v);
              break;
            }
          }
        }
        if (source.empty()) return invalid_argument(w + ": Image block does not contain a valid source");
        images->push_back(source);
        // Marked so the renderer makes this placeholder (and no text a client wrote) the image token.
        block = ojson{{"type", "text"}, {"text", kImagePlaceholder}, {kImageBlockKey, true}};
      } else if (type == "tool_result" && get(block, "content").is_array()) {
        CEDAR_RETURN_IF_ERROR(process_blocks(&block["content"], images, w));
      } else if (type == "text") {
        const ojson& t = get(block, "text");
        if (!opt_.plain_image_placeholder_text && t.is_string() &&
            t.get<std::string>().find(kImagePlaceholder) != std::string::npos) {
          return invalid_argument(w + ": Text block contains image placeholder '" + std::string(kImagePlaceholder) +
                                  "'. Images should be separate content blocks.");
        }
      }
    }
    return {};
  }

  Status process_images(std::vector<ojson>* msgs, std::vector<std::string>* images) {
    for (size_t i = 0; i < msgs->size(); ++i) {
      ojson& msg = (*msgs)[i];
      const ojson& content = get(msg, "content");
      if (!opt_.plain_image_placeholder_text && content.is_string() &&
          content.get<std::string>().find(kImagePlaceholder) != std::string::npos) {
        return invalid_argument(where(i) + ": Message content contains image special token '" +
                                std::string(kImagePlaceholder) + "'. Images should be provided as image content blocks.");
      }
      const ojson& rc = get(msg, "reasoning_content");
      if (!opt_.plain_image_placeholder_text && rc.is_string() &&
          rc.get<std::string>().find(kImagePlaceholder) != std::string::npos) {
        return invalid_argument(where(i) + ": reasoning_content contains image special token '" +
                                std::string(kImagePlaceholder) + "'");
      }
      if (content.is_array() && !msg.contains("content_blocks")) {
        msg["content_blocks"] = content;
        msg.erase("content");
      }
      if (python_truthy(get(msg, "content_blocks"))) {
        if (!msg["content_blocks"].is_array()) return invalid_argument(where(i) + ".content_blocks must be an array");
        CEDAR_RETURN_IF_ERROR(process_blocks(&msg["content_blocks"], images, where(i)));
        if (!get(msg, "content").is_string()) {
          std::string joined;
          bool first = true;
          for (const auto& b : msg["content_blocks"]) {
            if (!b.is_object() || get(b, "type") != "text") continue;
            const ojson& t = b.contains("text") ? b["text"] : ojson("");
            if (!t.is_string()) return invalid_argument(where(i) + ": a text block's \"text\" must be a string");
            if (!first) joined += "\n\n";
            first = false;
            joined += t.get<std::string>();
          }
          msg["content"] = joined;
        }
      }
    }
    return {};
  }

  static bool is_user_with_blocks(const ojson& m) { return get(m, "role") == "user" && m.contains("content_blocks"); }

  Result<std::vector<ojson>> merge_tool_messages(const std::vector<ojson>& msgs) {
    std::vector<ojson> merged;
    for (const ojson& msg : msgs) {
      const std::string role = get_role(msg);
      if (role == "tool") {
        ojson block = {{"type", "tool_result"},
                       {"tool_use_id", msg.contains("tool_call_id") ? msg["tool_call_id"] : ojson("")},
                       {"content", msg.contains("content") ? msg["content"] : ojson("")}};
        if (!merged.empty() && is_user_with_blocks(merged.back())) {
          merged.back()["content_blocks"].push_back(std::move(block));
        } else {
          merged.push_back(ojson{{"role", "user"}, {"content_blocks", ojson::array({std::move(block)})}});
        }
      } else if (role == "user") {
        const bool can_extend = !merged.empty() && is_user_with_blocks(merged.back()) && get(merged.back(), "task").is_null();
        if (v41_) {
          ojson blocks = get(msg, "content_blocks");
          if (blocks.is_null()) {
            blocks = ojson::array({ojson{{"type", "text"}, {"text", msg.contains("content") ? msg["content"] : ojson("")}}});
          }
          if (!blocks.is_array()) return invalid_argument("a user message's content_blocks must be an array");
          if (can_extend) {
            for (auto& b : blocks) merged.back()["content_blocks"].push_back(b);
          } else {
            ojson m = msg;
            m["content_blocks"] = blocks;
            merged.push_back(std::move(m));
          }
        } else {
          // V4 keeps only content, task, wo_eos and mask of a user message.
          ojson text_block = {{"type", "text"}, {"text", msg.contains("content") ? msg["content"] : ojson("")}};
          if (can_extend) {
            merged.back()["content_blocks"].push_back(std::move(text_block));
          } else {
            ojson m = {{"role", "user"},
                       {"content", msg.contains("content") ? msg["content"] : ojson("")},
                       {"content_blocks", ojson::array({std::move(text_block)})}};
            for (const char* key : {"task", "wo_eos", "mask"}) {
              if (msg.contains(key)) m[key] = msg[key];
            }
            merged.push_back(std::move(m));
          }
        }
      } else {
        merged.push_back(msg);
      }
    }
    return merged;
  }

  // Orders the tool_result blocks of each user turn like the preceding assistant's tool_calls.
  static void sort_tool_results(std::vector<ojson>* msgs) {
    std::vector<std::pair<ojson, int>> order;  // call id -> position
    for (ojson& msg : *msgs) {
      const std::string role = get_role(msg);
      if (role == "assistant" && python_truthy(get(msg, "tool_calls")) && msg["tool_calls"].is_array()) {
        order.clear();
        int idx = 0;
        for (const auto& tc : msg["tool_calls"]) {
          ojson id = tc.is_object() ? get(tc, "id") : ojson();
          if (!python_truthy(id) && tc.is_object() && get(tc, "function").is_object()) id = get(tc["function"], "id");
          if (python_truthy(id)) {
            auto it = std::find_if(order.begin(), order.end(), [&](const auto& p) { return p.first == id; });
            if (it == order.end()) order.emplace_back(id, idx);
            else it->second = idx;
          }
          ++idx;
        }
      } else if (role == "user" && python_truthy(get(msg, "content_blocks")) && msg["content_blocks"].is_array()) {
        ojson& blocks = msg["content_blocks"];
        std::vector<ojson> tool_blocks;
        for (const auto& b : blocks) {
          if (b.is_object() && get(b, "type") == "tool_result") tool_blocks.push_back(b);
        }
        if (tool_blocks.size() <= 1 || order.empty()) continue;
        auto key = [&](const ojson& b) {
          const ojson& id = b.contains("tool_use_id") ? b["tool_use_id"] : ojson("");
          for (const auto& [k, v] : order) {
            if (k == id) return v;
          }
          return 0;
        };
        std::stable_sort(tool_blocks.begin(), tool_blocks.end(),
                         [&](const ojson& a, const ojson& b) { return key(a) < key(b); });
        size_t next = 0;
        for (auto& b : blocks) {
          if (b.is_object() && get(b, "type") == "tool_result") b = tool_blocks[next++];
        }
      }
    }
  }

  // Index of the last user turn (V4.1: a system message after the first counts; V4: developer).
  int last_user_index(const std::vector<ojson>& msgs) const {
    for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i) {
      const std::string role = get_role(msgs[i]);
      if (role == "user") return i;
      if (v41_ && role == "system" && i > 0) return i;
      if (!v41_ && role == "developer") return i;
    }
    return -1;
  }

  // recipe_turns: the index of the turn being generated, the final message when the model continues
  // it ("wo_eos" on an assistant message), else one past the end (a new turn). Official: the last
  // user turn's index (reasoning is kept from there on).
  int current_turn_index(const std::vector<ojson>& msgs) const {
    if (!opt_.recipe_turns) return last_user_index(msgs);
    const int n = static_cast<int>(msgs.size());
    if (n == 0 || get_role(msgs.back()) != "assistant" || !python_truthy(get(msgs.back(), "wo_eos"))) return n;
    // deepseek-recipe keeps a continued message's reasoning only after a user or system turn.
    for (int i = n - 2; i >= 0; --i) {
      const std::string role = get_role(msgs[i]);
      if (role == "user" || role == "system" || (!v41_ && role == "developer")) return n - 1;
    }
    return n;
  }

  std::vector<ojson> drop_thinking_messages(const std::vector<ojson>& msgs) const {
    const int last_user = current_turn_;
    std::vector<ojson> out;
    for (size_t i = 0; i < msgs.size(); ++i) {
      const std::string role = get_role(msgs[i]);
      const bool keep = role == "user" || role == "system" || role == "tool" || role == "latest_reminder" ||
                        role == "direct_search_results" || static_cast<int>(i) >= last_user;
      if (keep) {
        out.push_back(msgs[i]);
      } else if (role == "assistant") {
        ojson m = msgs[i];
        m.erase("reasoning_content");
        out.push_back(std::move(m));
      }
      // Other roles before the last user turn are dropped, as in the official encoder.
    }
    return out;
  }

  // --- rendering --------------------------------------------------------------------------------

  // The effort prefix of message `index`; also validates the effort for every message.
  Result<std::string> effort_prefix(size_t index) const {
    const ojson& e = opt_.reasoning_effort;
    const bool thinking0 = index == 0 && opt_.thinking_mode == ThinkingMode::kThinking;
    if (v41_) {
      static constexpr std::pair<std::string_view, int> kAliases[] = {{"low", 25}, {"high", 50}, {"xhigh", 75}, {"max", 100}};
      int budget = -1;
      if (e.is_null()) {
        budget = 50;  // "high"
      } else if ((e.is_number_integer() || e.is_number_unsigned()) && e.get<int64_t>() >= 1 && e.get<int64_t>() <= 100) {
        budget = static_cast<int>(e.get<int64_t>());
      } else if (e.is_string()) {
        for (const auto& [name, value] : kAliases) {
          if (e.get<std::string>() == name) budget = value;
        }
      }
      if (budget < 0) {
        auto shown = python_str(e, "reasoning_effort");
        return invalid_argument("Invalid reasoning effort for deepseek_v41: " +
                                (shown.ok() ? *shown : python_json_dumps(e)) +
                                ", should be int within [1,100] or ['low', 'high', 'xhigh', 'max']");
      }
      if (!thinking0) return std::string();
      return "Reasoning Effort: " + std::to_string(budget) +
             " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
    }
    if (!(e.is_null() || e == "high" || e == "max")) {
      auto shown = python_str(e, "reasoning_effort");
      return invalid_argument("Invalid reasoning effort: " + (shown.ok() ? *shown : python_json_dumps(e)) +
                              " (the V4 format takes 'high' or 'max')");
    }
    return thinking0 && e == "max" ? std::string(kV4MaxEffort) : std::string();
  }

  Result<Pieces> render_tools(const ojson& tools, const std::string& w) const {
    if (!tools.is_array()) return invalid_argument(w + ".tools must be an array of OpenAI tool objects");
    std::string schemas;
    for (size_t k = 0; k < tools.size(); ++k) {
      if (!tools[k].is_object() || !tools[k].contains("function")) {
        return invalid_argument(w + ".tools[" + std::to_string(k) + "] has no \"function\" (OpenAI format expected)");
      }
      if (k) schemas += "\n";
      schemas += python_json_dumps(tools[k]["function"]);
    }
    const DsmlNames n = dsml_names(opt_.format);
    std::string t(kToolsTemplate);
    t = replace_all(std::move(t), "{calls}", n.calls);
    t = replace_all(std::move(t), "{invoke}", n.invoke);
    t = replace_all(std::move(t), "{parameter}", n.parameter);
    // The schemas are client text: only the template around them names markers.
    const size_t at = t.find("{schemas}");
    Pieces out;
    out.templ(std::string_view(t).substr(0, at)).text(schemas).templ(std::string_view(t).substr(at + 9));
    return out;
  }

  Result<Pieces> system_extras(const ojson& msg, const std::string& w) const {
    Pieces out;
    if (python_truthy(get(msg, "tools"))) {
      CEDAR_ASSIGN_OR_RETURN(Pieces tools, render_tools(msg["tools"], w));
      out.text("\n\n").append(tools);
    }
    if (python_truthy(get(msg, "response_format"))) {
      out.text("\n\n").text(kResponseFormatPrefix).text(python_json_dumps(msg["response_format"]));
    }
    return out;
  }

  // A text block: the client's text, or the image token for a converted image block.
  static Pieces text_block(const ojson& block, const std::string& text) {
    Pieces out;
    if (python_truthy(get(block, kImageBlockKey))) return std::move(out.special(kImagePlaceholder));
    return std::move(out.text(text));
  }

  Result<Pieces> render_user_blocks(const ojson& blocks, const std::string& w) const {
    Pieces out;
    for (size_t k = 0; k < blocks.size(); ++k) {
      const ojson& b = blocks[k];
      if (k) out.text("\n\n");
      const ojson& type = b.is_object() ? get(b, "type") : ojson();
      if (type == "text") {
        const ojson& t = b.contains("text") ? b["text"] : ojson("");
        if (!t.is_string()) return invalid_argument(w + ": user content must be text (got a JSON " + std::string(t.type_name()) + ")");
        out.append(text_block(b, t.get<std::string>()));
      } else if (type == "tool_result") {
        const ojson& c = b.contains("content") ? b["content"] : ojson("");
        Pieces result;
        if (c.is_array()) {
          for (size_t j = 0; j < c.size(); ++j) {
            if (!c[j].is_object()) return invalid_argument(w + ": tool result content blocks must be objects");
            if (j) result.text("\n\n");
            if (get(c[j], "type") == "text") {
              const ojson& t = c[j].contains("text") ? c[j]["text"] : ojson("");
              if (!t.is_string()) return invalid_argument(w + ": a tool result text block needs string \"text\"");
              result.append(text_block(c[j], t.get<std::string>()));
            } else {
              CEDAR_ASSIGN_OR_RETURN(std::string tn, python_str(get(c[j], "type"), w + " block type"));
              result.text("[Unsupported " + tn + "]");
            }
          }
        } else {
          CEDAR_ASSIGN_OR_RETURN(std::string text, python_str(c, w + ": tool result content"));
          result.text(text);
        }
        out.text("<tool_result>").append(result).text("</tool_result>");
      } else {
        CEDAR_ASSIGN_OR_RETURN(std::string tn, python_str(type, w + " block type"));
        out.text("[Unsupported " + tn + "]");
      }
    }
    return out;
  }

  Result<Pieces> dsml_arguments(const ojson& tool_call, const std::string& w) const {
    const ojson& raw = tool_call["arguments"];
    ojson args = raw;
    if (v41_) {
      // Tolerates JSON strings, double-encoded ones included.
      for (int k = 0; k < 2 && args.is_string(); ++k) {
        try {
          args = ojson::parse(args.get<std::string>());
        } catch (const ojson::exception&) {
          break;
        }
      }
      if (!args.is_object()) args = ojson{{"arguments", raw}};
    } else {
      bool parsed = false;
      if (raw.is_string()) {
        try {
          args = ojson::parse(raw.get<std::string>());
          parsed = true;
        } catch (const ojson::exception&) {
        }
      }
      if (!parsed) {
        args = ojson{{"arguments", raw}};
      } else if (!args.is_object()) {
        return invalid_argument(w + ": tool call arguments must be a JSON object");
      }
    }
    const DsmlNames n = dsml_names(opt_.format);
    Pieces out;
    bool first = true;
    for (auto it = args.begin(); it != args.end(); ++it) {
      if (!first) out.text("\n");
      first = false;
      const bool is_str = it.value().is_string();
      out.text("<").special(kDsml).text(std::string(n.parameter) + " name=\"" + it.key() + "\" string=\"" +
                                         (is_str ? "true" : "false") + "\">");
      out.text(is_str ? it.value().get<std::string>() : python_json_dumps(it.value()));
      out.text("</").special(kDsml).text(std::string(n.parameter) + ">");
    }
    return out;
  }

  Result<Pieces> render_tool_calls(const ojson& calls, const std::string& w) const {
    if (!calls.is_array()) return invalid_argument(w + ".tool_calls must be an array");
    const DsmlNames n = dsml_names(opt_.format);
    Pieces list;
    for (size_t k = 0; k < calls.size(); ++k) {
      const std::string cw = w + ".tool_calls[" + std::to_string(k) + "]";
      const ojson& tc = calls[k];
      if (!tc.is_object() || !get(tc, "function").is_object() || !tc["function"].contains("name") ||
          !tc["function"].contains("arguments")) {
        return invalid_argument(cw + " needs \"function\": {\"name\", \"arguments\"} (OpenAI format)");
      }
      CEDAR_ASSIGN_OR_RETURN(std::string name, python_str(tc["function"]["name"], cw + ".function.name"));
      CEDAR_ASSIGN_OR_RETURN(Pieces args, dsml_arguments(tc["function"], cw));
      if (k) list.text("\n");
      list.text("<").special(kDsml).text(std::string(n.invoke) + " name=\"" + name + "\">\n");
      list.append(args).text("\n</").special(kDsml).text(std::string(n.invoke) + ">");
    }
    Pieces out;
    out.text("\n\n<").special(kDsml).text(std::string(n.calls) + ">\n").append(list);
    out.text("\n</").special(kDsml).text(std::string(n.calls) + ">");
    return out;
  }

  Result<Pieces> render(size_t index, const std::vector<ojson>& msgs, bool drop) const {
    const ojson& msg = msgs[index];
    const std::string w = where(index);
    const std::string role = get_role(msg);
    const int last_user = last_user_index(msgs);
    const bool thinking = opt_.thinking_mode == ThinkingMode::kThinking;

    CEDAR_ASSIGN_OR_RETURN(std::string effort, effort_prefix(index));
    Pieces prompt;
    if (v41_ && index == 0 && (!effort.empty() || role == "system")) prompt.special(kSystemMarker);
    prompt.text(effort);

    if (role == "system") {
      if (v41_ && index > 0) prompt.special(kSystemMarker);
      CEDAR_ASSIGN_OR_RETURN(std::string content, text_or_empty(get(msg, "content"), w + ".content"));
      CEDAR_ASSIGN_OR_RETURN(Pieces extras, system_extras(msg, w));
      prompt.text(content).append(extras);
    } else if (role == "developer" && !v41_) {
      if (!python_truthy(get(msg, "content"))) return invalid_argument(w + ": a developer message needs content");
      CEDAR_ASSIGN_OR_RETURN(std::string content, python_str(msg["content"], w + ".content"));
      CEDAR_ASSIGN_OR_RETURN(Pieces extras, system_extras(msg, w));
      prompt.special(kUserMarker).text(content).append(extras);
    } else if (role == "user") {
      prompt.special(kUserMarker);
      const ojson& blocks = get(msg, "content_blocks");
      if (python_truthy(blocks)) {
        CEDAR_ASSIGN_OR_RETURN(Pieces body, render_user_blocks(blocks, w));
        prompt.append(body);
      } else {
        CEDAR_ASSIGN_OR_RETURN(std::string content, text_or_empty(get(msg, "content"), w + ".content"));
        prompt.text(content);
      }
    } else if (role == "latest_reminder") {
      CEDAR_ASSIGN_OR_RETURN(std::string content, python_str(get(msg, "content"), w + ".content"));
      prompt.special(kLatestReminderMarker).text(content);
    } else if (role == "assistant") {
      Pieces calls;
      if (python_truthy(get(msg, "tool_calls"))) {
        CEDAR_ASSIGN_OR_RETURN(calls, render_tool_calls(msg["tool_calls"], w));
      }
      CEDAR_ASSIGN_OR_RETURN(std::string content, text_or_empty(get(msg, "content"), w + ".content"));
      CEDAR_ASSIGN_OR_RETURN(std::string reasoning,
                             text_or_empty(get(msg, "reasoning_content"), w + ".reasoning_content"));
      const bool model_text = python_truthy(get(msg, kModelTextKey));
      const bool prev_has_task = index > 0 && !get(msgs[index - 1], "task").is_null();
      const bool continued = python_truthy(get(msg, "wo_eos"));
      const bool keeps_reasoning =
          opt_.recipe_turns ? static_cast<int>(index) >= current_turn_ : static_cast<int>(index) > last_user;
      if (opt_.recipe_turns && !follows_header(index, msgs)) {
        prompt.special(kAssistantMarker).special(thinking && (!drop || keeps_reasoning) ? kThinkStart : kThinkEnd);
      }
      if (thinking && !prev_has_task && (!drop || keeps_reasoning)) {
        if (model_text) prompt.model_text(reasoning);
        else prompt.text(reasoning);
        // A continued message without an answer yet continues its reasoning.
        const bool reasoning_open = opt_.recipe_turns && continued && content.empty() && calls.empty();
        if (!reasoning_open) prompt.special(kThinkEnd);
      }
      if (model_text) prompt.model_text(content);
      else prompt.text(content);
      prompt.append(calls);
      if (!continued) prompt.special(kEos);
      if (opt_.recipe_turns && !continued && index + 1 == msgs.size()) {
        prompt.special(kAssistantMarker).special(thinking ? kThinkStart : kThinkEnd);  // the new turn
      }
    } else if (role == "tool") {
      return internal_error(w + ": tool message survived merging");
    } else {
      return invalid_argument(w + ": Unknown role: " + role + (v41_ ? " (V4.1 roles: system, user, assistant, tool, "
                                                                      "latest_reminder)"
                                                                    : " (V4 roles: system, developer, user, "
                                                                      "assistant, tool, latest_reminder)"));
    }

    // What follows the message: nothing when another non-assistant turn comes next.
    if (index + 1 < msgs.size()) {
      const std::string next = get_role(msgs[index + 1]);
      if (next != "assistant" && next != "latest_reminder") return prompt;
    }
    const ojson& task = get(msg, "task");
    if (!task.is_null()) {
      std::string_view marker;
      for (const auto& [name, m] : kTasks) {
        if (task == name) marker = m;
      }
      if (marker.empty()) {
        CEDAR_ASSIGN_OR_RETURN(std::string t, python_str(task, w + ".task"));
        return invalid_argument(w + ": Invalid task: '" + t +
                                "'. Valid tasks are: action, query, authority, domain, title, read_url");
      }
      if (task != "action") {
        prompt.special(marker);
      } else {
        prompt.special(kAssistantMarker).special(thinking ? kThinkStart : kThinkEnd).special(marker);
      }
    } else if (role == "user" || (v41_ && role == "system" && index > 0) || (!v41_ && role == "developer")) {
      prompt.special(kAssistantMarker);
      const bool open_thinking = thinking && (!drop || (opt_.recipe_turns ? static_cast<int>(index) + 1 >= current_turn_
                                                                           : static_cast<int>(index) >= last_user));
      prompt.special(open_thinking ? kThinkStart : kThinkEnd);
    }
    return prompt;
  }

  // recipe_turns: whether the message before assistant message `index` ended with the assistant
  // header (a user turn, a later system message, a task), so the assistant message needs none.
  bool follows_header(size_t index, const std::vector<ojson>& msgs) const {
    if (index == 0) return false;
    const ojson& prev = msgs[index - 1];
    const std::string role = get_role(prev);
    return !get(prev, "task").is_null() || role == "user" || (v41_ && role == "system" && index - 1 > 0) ||
           (!v41_ && role == "developer");
  }

  const ChatOptions& opt_;
  bool v41_;
  int current_turn_ = -1;
};

}  // namespace

DsmlNames dsml_names(PromptFormat format) {
  if (format == PromptFormat::kV41) return {" calls", " invoke", " parameter"};
  return {"tool_calls", "invoke", "parameter"};
}

Result<ChatPrompt> encode_chat(const nlohmann::ordered_json& messages, const ChatOptions& options) {
  try {
    return Encoder(options).run(messages);
  } catch (const nlohmann::ordered_json::exception& e) {
    return invalid_argument(std::string("malformed messages: ") + e.what());
  }
}

Result<ChatPrompt> encode_chat_json(std::string_view messages_json, const ChatOptions& options) {
  ojson parsed;
  try {
    parsed = ojson::parse(messages_json);
  } catch (const ojson::exception& e) {
    return invalid_argument(std::string("messages are not valid JSON: ") + e.what());
  }
  if (parsed.is_object()) {
    if (!parsed.contains("messages")) return invalid_argument("a messages object needs a \"messages\" array");
    ojson messages = parsed["messages"];
    if (parsed.contains("tools")) {
      if (!messages.is_array() || messages.empty()) return invalid_argument("A case with tools must contain at least one message");
      messages[0]["tools"] = parsed["tools"];
    }
    return encode_chat(messages, options);
  }
  return encode_chat(parsed, options);
}

std::vector<std::pair<size_t, size_t>> special_ranges(const ChatPrompt& prompt) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const PromptSpan& s : prompt.spans)
    if (s.kind == SpanKind::kSpecial) out.emplace_back(s.begin, s.end);
  return out;
}

Result<std::vector<TokenId>> encode_chat_ids(const Tokenizer& tokenizer, const ChatPrompt& prompt, PromptFormat format) {
  std::vector<TokenId> ids;
  ids.reserve(prompt.text.size() / 3 + 8);
  for (const PromptSpan& s : prompt.spans) {
    const std::string_view piece = std::string_view(prompt.text).substr(s.begin, s.end - s.begin);
    switch (s.kind) {
      case SpanKind::kSpecial: {
        std::optional<TokenId> id = tokenizer.token_to_id(piece);
        if (!id) {
          return failed_precondition("the tokenizer has no single token for '" + std::string(piece) + "', which the " +
                                     (format == PromptFormat::kV41 ? "V4.1" : "V4") +
                                     " prompt format needs: use the tokenizer.json shipped with the checkpoint");
        }
        ids.push_back(*id);
        break;
      }
      case SpanKind::kText: CEDAR_RETURN_IF_ERROR(tokenizer.encode_plain_append(piece, &ids)); break;
      case SpanKind::kModelText: CEDAR_RETURN_IF_ERROR(tokenizer.encode_append(piece, &ids)); break;
    }
  }
  return ids;
}

Status validate_reasoning_effort(const nlohmann::ordered_json& effort, PromptFormat format) {
  ChatOptions o;
  o.format = format;
  o.reasoning_effort = effort;
  // One plain user turn exercises only the effort check.
  auto r = encode_chat(ojson::array({ojson{{"role", "user"}, {"content", ""}}}), o);
  return r.ok() ? Status() : r.status();
}

nlohmann::ordered_json reasoning_effort_from_flag(const std::string& flag) {
  if (!flag.empty() && flag.size() <= 9 && std::all_of(flag.begin(), flag.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::stoll(flag);
  }
  return flag;
}

}  // namespace cedar::chat
