#include "tokenizer/completion_parser.h"

#include <algorithm>
#include <utility>

#include "tokenizer/python_json.h"
#include "tokenizer/utf8.h"

namespace cedar::tokenizer {
namespace {

// A DSML block that never closes must not grow without bound.
constexpr size_t kMaxPendingBytes = 8u << 20;

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Length of the longest suffix of `s` that is a proper prefix of `marker`.
size_t partial_suffix(std::string_view s, std::string_view marker) {
  const size_t max = std::min(s.size(), marker.size() - 1);
  for (size_t n = max; n > 0; --n) {
    if (s.compare(s.size() - n, n, marker.substr(0, n)) == 0) return n;
  }
  return 0;
}

struct Found {
  size_t pos = std::string_view::npos;
  size_t marker = 0;  // index into the marker list
};

Found find_first(std::string_view s, const std::vector<std::string_view>& markers) {
  Found best;
  for (size_t i = 0; i < markers.size(); ++i) {
    const size_t p = s.find(markers[i]);
    if (p != std::string_view::npos && p < best.pos) best = {p, i};
  }
  return best;
}

bool is_prefix_of_any(std::string_view s, const std::vector<std::string>& candidates) {
  for (const auto& c : candidates) {
    if (c.compare(0, std::min(c.size(), s.size()), s.substr(0, std::min(c.size(), s.size()))) == 0 &&
        s.size() <= c.size()) {
      return true;
    }
  }
  return false;
}

// The official regex ^\s*name="(.*?)">\n$ (Python: `$` also matches before a final newline).
bool parse_invoke_name(std::string_view content, std::string* name) {
  size_t i = 0;
  while (i < content.size()) {
    size_t next = i;
    if (!python_isspace(next_code_point(content, &next))) break;
    i = next;
  }
  constexpr std::string_view kOpen = "name=\"";
  if (content.compare(i, kOpen.size(), kOpen) != 0) return false;
  std::string_view rest = content.substr(i + kOpen.size());
  // The format writes "\">\n" (or "\">\n\n"); any run of ASCII white space after the ">" is
  // accepted, as between the other DSML tags (see scan_calls).
  const size_t last = rest.find_last_not_of(" \n\r\t");
  if (last == std::string_view::npos || rest.size() - last - 1 == 0) return false;
  rest = rest.substr(0, last + 1);
  if (!ends_with(rest, "\">")) return false;
  *name = std::string(rest.substr(0, rest.size() - 2));
  return true;
}

// The official regex ^ name="(.*?)" string="(true|false)">(.*?)<$ with DOTALL.
bool parse_parameter(std::string_view content, std::string* name, std::string* value, bool* is_string) {
  constexpr std::string_view kOpen = " name=\"";
  if (content.compare(0, kOpen.size(), kOpen) != 0) return false;
  const std::string_view rest = content.substr(kOpen.size());
  for (size_t i = 0; i < rest.size(); ++i) {
    for (const bool flag : {true, false}) {
      const std::string_view sep = flag ? "\" string=\"true\">" : "\" string=\"false\">";
      if (rest.compare(i, sep.size(), sep) != 0) continue;
      const std::string_view v = rest.substr(i + sep.size());
      if (ends_with(v, "<")) {
        *value = std::string(v.substr(0, v.size() - 1));
      } else if (ends_with(v, "<\n")) {
        *value = std::string(v.substr(0, v.size() - 2));
      } else {
        return false;  // the end does not depend on where the name stops
      }
      *name = std::string(rest.substr(0, i));
      *is_string = flag;
      return true;
    }
  }
  return false;
}

}  // namespace

std::string dsml_arguments_json(const std::vector<std::pair<std::string, std::pair<std::string, bool>>>& params) {
  std::string out = "{";
  bool first = true;
  for (const auto& [name, vs] : params) {
    if (!first) out += ", ";
    first = false;
    out += python_json_dumps(nlohmann::ordered_json(name)) + ": ";
    out += vs.second ? python_json_dumps(nlohmann::ordered_json(vs.first)) : vs.first;
  }
  return out + "}";
}

CompletionParser::CompletionParser(ThinkingMode mode, PromptFormat format)
    : format_(format), state_(mode == ThinkingMode::kThinking ? State::kReasoning : State::kContent) {
  const DsmlNames n = dsml_names(format);
  const std::string dsml(kDsml);
  calls_start_ = "\n\n<" + dsml + std::string(n.calls);
  calls_end_ = "</" + dsml + std::string(n.calls) + ">";
  invoke_start_ = "<" + dsml + std::string(n.invoke);
  invoke_end_ = "</" + dsml + std::string(n.invoke);
  param_start_ = "<" + dsml + std::string(n.parameter);
  param_end_ = "/" + dsml + std::string(n.parameter);
}

void CompletionParser::fail(std::vector<ParseEvent>* events, std::string message) {
  state_ = State::kFailed;
  pending_.clear();
  events->push_back({ParseEvent::Type::kError, std::move(message), {}});
}

std::vector<ParseEvent> CompletionParser::feed(std::string_view text) {
  std::vector<ParseEvent> events;
  if (state_ == State::kDone || state_ == State::kFailed) return events;
  pending_.append(text);
  run(&events, /*at_end=*/false);
  if (state_ != State::kFailed && state_ != State::kDone && pending_.size() > kMaxPendingBytes) {
    fail(&events, "completion holds an unterminated DSML block longer than 8 MiB");
  }
  return events;
}

std::vector<ParseEvent> CompletionParser::finish() {
  std::vector<ParseEvent> events;
  if (state_ == State::kDone || state_ == State::kFailed) return events;
  run(&events, /*at_end=*/true);
  if (state_ == State::kFailed) return events;
  switch (state_) {
    case State::kReasoning: fail(&events, "Invalid thinking format: missing </think>"); break;
    case State::kContent: fail(&events, "Invalid format: missing EOS token"); break;
    case State::kToolCalls:
      fail(&events, "completion ended inside a DSML tool-call block (truncated output): '" + pending_ + "'");
      break;
    case State::kAfterCalls:
      if (!pending_.empty()) {
        fail(&events, "Unexpected content after tool calls");
        break;
      }
      [[fallthrough]];  // the official parser accepts a closed calls block without EOS
    case State::kAfterEos:
      state_ = State::kDone;
      events.push_back({ParseEvent::Type::kDone, "", {}});
      break;
    default: break;
  }
  return events;
}

void CompletionParser::run(std::vector<ParseEvent>* events, bool at_end) {
  bool progress = true;
  while (progress && state_ != State::kFailed && state_ != State::kDone) {
    switch (state_) {
      case State::kReasoning:
      case State::kContent: progress = scan_text(events, at_end); break;
      case State::kToolCalls: progress = scan_calls(events, at_end); break;
      case State::kAfterCalls: {
        const std::string_view eos(kEos);
        if (pending_.compare(0, eos.size(), eos) == 0) {
          pending_.erase(0, eos.size());
          state_ = State::kAfterEos;
        } else if (!eos.starts_with(pending_)) {
          fail(events, "Unexpected content after tool calls");
        }
        progress = state_ == State::kAfterEos;
        break;
      }
      case State::kAfterEos:
        if (!pending_.empty()) fail(events, "Unexpected content at end: '" + pending_ + "' follows the EOS token");
        progress = false;
        break;
      default: progress = false;
    }
  }
}

bool CompletionParser::scan_text(std::vector<ParseEvent>* events, bool at_end) {
  const bool reasoning = state_ == State::kReasoning;
  const auto delta_type = reasoning ? ParseEvent::Type::kReasoningDelta : ParseEvent::Type::kContentDelta;
  // Markers in order of handling: the block/section ends first, then tokens that may not appear.
  std::vector<std::string_view> markers = {calls_start_, kEos, kThinkEnd, kBos, kThinkStart, kDsml};
  if (!parse_tool_calls_) markers = {kEos, kThinkEnd, kBos, kThinkStart};
  const Found f = find_first(pending_, markers);
  // Text from `partial_start` on may still grow into a marker (a longer one can begin before a
  // shorter one already found, e.g. "\n\n<｜DSML｜" before " calls" arrives).
  size_t hold = 0;
  if (!at_end) {
    for (std::string_view m : markers) hold = std::max(hold, partial_suffix(pending_, m));
  }
  const size_t partial_start = pending_.size() - hold;
  if (f.pos == std::string_view::npos || f.pos >= partial_start) {
    // Never split a UTF-8 character between two deltas.
    size_t emit = partial_start - incomplete_utf8_tail(std::string_view(pending_).substr(0, partial_start));
    if (f.pos != std::string_view::npos) emit = std::min(emit, f.pos);
    if (emit > 0) {
      events->push_back({delta_type, pending_.substr(0, emit), {}});
      pending_.erase(0, emit);
    }
    return false;
  }
  if (f.pos > 0) events->push_back({delta_type, pending_.substr(0, f.pos), {}});
  const std::string_view marker = markers[f.marker];
  pending_.erase(0, f.pos + marker.size());
  const std::string where = reasoning ? "reasoning_content" : "content";
  if (marker == calls_start_) {
    if (reasoning) {
      fail(events, "Invalid thinking format: missing </think> before the tool calls");
      return false;
    }
    state_ = State::kToolCalls;
    call_state_ = CallState::kBetweenInvokes;
    return true;
  }
  if (marker == kEos) {
    if (reasoning) {
      fail(events, "Invalid thinking format: missing </think> (the reasoning ended with the EOS token)");
      return false;
    }
    state_ = State::kAfterEos;
    return true;
  }
  if (marker == kThinkEnd && reasoning) {
    state_ = State::kContent;
    return true;
  }
  fail(events, "Unexpected special token '" + std::string(marker) + "' in " + where);
  return false;
}

bool CompletionParser::scan_calls(std::vector<ParseEvent>* events, bool at_end) {
  const std::string kSep = ">\n";
  // Between DSML tags the format writes ">\n"; ">" followed by any run of ASCII white space is
  // accepted too, because constrained decoding's grammar (xgrammar's DeepSeek-V4.1 layout) lets the
  // model put a bounded run of white space there. The calls read the same either way.
  auto is_ascii_space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  auto need_separator = [&](const std::vector<std::string>& nexts, const char* what) -> int {
    // Returns the index of the marker that follows the separator, -1 to wait, -2 on error.
    std::vector<std::string_view> views(nexts.begin(), nexts.end());
    const Found f = find_first(pending_, views);
    if (f.pos == std::string_view::npos) {
      size_t ws = pending_.empty() || pending_[0] != '>' ? 0 : 1;
      while (ws < pending_.size() && ws > 0 && is_ascii_space(pending_[ws])) ++ws;
      std::vector<std::string> markers(nexts.begin(), nexts.end());
      const bool may_continue = pending_.empty() || (ws > 0 && is_prefix_of_any(pending_.substr(ws), markers));
      if (!may_continue) {
        fail(events, std::string(what) + ": expected '>\\n' but got '" + pending_ + "'");
        return -2;
      }
      return -1;
    }
    const std::string between = pending_.substr(0, f.pos);
    const bool separator = !between.empty() && between[0] == '>' &&
                           std::all_of(between.begin() + 1, between.end(), is_ascii_space);
    if (!separator) {
      fail(events, std::string(what) + ": expected '>\\n' but got '" + between + "'");
      return -2;
    }
    pending_.erase(0, f.pos + nexts[f.marker].size());
    return static_cast<int>(f.marker);
  };
  auto emit_call = [&] {
    ToolCall call{call_name_, dsml_arguments_json(call_params_)};
    events->push_back({ParseEvent::Type::kToolCall, "", std::move(call)});
    call_params_.clear();
    call_state_ = CallState::kBetweenInvokes;
  };
  (void)at_end;  // truncation is reported by finish()

  switch (call_state_) {
    case CallState::kBetweenInvokes: {
      const int next = need_separator({invoke_start_, calls_end_}, "Tool call format error");
      if (next < 0) return false;
      if (next == 1) {
        state_ = State::kAfterCalls;
      } else {
        call_state_ = CallState::kInvokeName;
      }
      return true;
    }
    case CallState::kInvokeName: {
      const Found f = find_first(pending_, {param_start_, invoke_end_});
      if (f.pos == std::string_view::npos) return false;
      const std::string content = pending_.substr(0, f.pos);
      if (!parse_invoke_name(content, &call_name_)) {
        fail(events, "Tool name format error: '" + content + "'");
        return false;
      }
      pending_.erase(0, f.pos + (f.marker == 0 ? param_start_.size() : invoke_end_.size()));
      call_params_.clear();
      if (f.marker == 0) {
        call_state_ = CallState::kParameter;
      } else {
        emit_call();
      }
      return true;
    }
    case CallState::kParameter: {
      const size_t p = pending_.find(param_end_);
      if (p == std::string::npos) return false;
      const std::string content = pending_.substr(0, p);
      std::string name, value;
      bool is_string = false;
      if (!parse_parameter(content, &name, &value, &is_string)) {
        fail(events, "Parameter format error: '" + content + "'");
        return false;
      }
      for (const auto& existing : call_params_) {
        if (existing.first == name) {
          fail(events, "Duplicate parameter name: '" + name + "'");
          return false;
        }
      }
      call_params_.push_back({name, {value, is_string}});
      pending_.erase(0, p + param_end_.size());
      call_state_ = CallState::kAfterParameter;
      return true;
    }
    case CallState::kAfterParameter: {
      const int next = need_separator({param_start_, invoke_end_}, "Parameter format error");
      if (next < 0) return false;
      if (next == 0) {
        call_state_ = CallState::kParameter;
      } else {
        emit_call();
      }
      return true;
    }
  }
  return false;
}

Result<ParsedCompletion> parse_completion(std::string_view text, ThinkingMode mode, PromptFormat format) {
  CompletionParser parser(mode, format);
  ParsedCompletion out;
  std::vector<ParseEvent> events = parser.feed(text);
  for (auto& e : parser.finish()) events.push_back(std::move(e));
  for (auto& e : events) {
    switch (e.type) {
      case ParseEvent::Type::kReasoningDelta: out.reasoning_content += e.text; break;
      case ParseEvent::Type::kContentDelta: out.content += e.text; break;
      case ParseEvent::Type::kToolCall: out.tool_calls.push_back(std::move(e.tool_call)); break;
      case ParseEvent::Type::kError: return invalid_argument(e.text);
      case ParseEvent::Type::kDone: break;
    }
  }
  return out;
}

}  // namespace cedar::tokenizer
