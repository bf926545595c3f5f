#include "chat/completion_parser.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "tokenizer/marker_tokens.h"

namespace cedar::chat {

using tokenizer::kDsml;
using tokenizer::kEos;
using tokenizer::kThinkEnd;

namespace {

using Action = CompletionParser::Action;
using Branch = CompletionParser::Branch;
using PatternUnit = CompletionParser::PatternUnit;
using Stage = CompletionParser::Stage;
using StageState = CompletionParser::StageState;

// A marker's parts: plain template text, or the spelling of a special token.
struct Part {
  std::string_view text;
  bool special;
};

std::vector<PatternUnit> units_of(std::initializer_list<Part> parts) {
  std::vector<PatternUnit> units;
  for (const Part& p : parts)
    for (char c : p.text) units.push_back({c, p.special});
  return units;
}

// The KMP failure table over whole units (byte and part kind). A kText chunk matches a unit by its
// byte alone; the markers here have no border whose kinds differ from the marker's start, so the
// table stays valid for it (as deepseek-recipe notes for the same markers).
std::vector<size_t> failure_table(const std::vector<PatternUnit>& p) {
  std::vector<size_t> table(p.size(), 0);
  const auto same = [](PatternUnit a, PatternUnit b) { return a.byte == b.byte && a.special == b.special; };
  size_t len = 0;
  for (size_t i = 1; i < p.size();) {
    if (same(p[i], p[len])) {
      table[i++] = ++len;
    } else if (len != 0) {
      len = table[len - 1];
    } else {
      table[i++] = 0;
    }
  }
  return table;
}

// The markers, as pattern units with their KMP tables; built once, shared by every parser (the
// branches point into them).
struct Marker {
  std::vector<PatternUnit> units;
  std::vector<size_t> failure;
};
struct Markers {
  Marker dsml_open, dsml_close, calls_close, tool_calls_close, think_end, invoke, quote, parameter, space,
      string_true, string_false, json_fence, plain_fence, json_close, brace, bracket;
};

const Markers& markers() {
  static const Markers m = [] {
    const std::string_view dsml = kDsml;
    auto make = [](std::initializer_list<Part> parts) {
      Marker marker;
      marker.units = units_of(parts);
      marker.failure = failure_table(marker.units);
      return marker;
    };
    Markers out;
    // Both the V4.1 (" calls>") and the V4 ("tool_calls>") spelling end the block; the other tags
    // are read from their attribute on, so both spellings of them work alike.
    out.dsml_open = make({{"<", false}, {dsml, true}});
    out.dsml_close = make({{"</", false}, {dsml, true}});
    out.calls_close = make({{"</", false}, {dsml, true}, {" calls>", false}});
    out.tool_calls_close = make({{"</", false}, {dsml, true}, {"tool_calls>", false}});
    out.think_end = make({{kThinkEnd, true}});
    out.invoke = make({{"invoke name=\"", false}});
    out.quote = make({{"\"", false}});
    out.parameter = make({{"parameter name=", false}});
    out.space = make({{" ", false}});
    out.string_true = make({{"true\">", false}});
    out.string_false = make({{"false\">", false}});
    // JSON output: the fence lines a model writes around JSON (the fence line itself is dropped),
    // the closing fence (with the newline before it, so JSON never ends on a newline of its own),
    // and the first byte of bare JSON.
    out.json_fence = make({{"```json\n", false}});
    out.plain_fence = make({{"```\n", false}});
    out.json_close = make({{"\n```", false}});
    out.brace = make({{"{", false}});
    out.bracket = make({{"[", false}});
    return out;
  }();
  return m;
}

bool unit_matches(PatternUnit unit, char byte, ChunkKind kind) {
  if (unit.byte != byte) return false;
  switch (kind) {
    case ChunkKind::kText: return true;
    case ChunkKind::kPlainTokens: return !unit.special;
    case ChunkKind::kSpecialToken: return unit.special;
  }
  return false;
}

// JSON string content of `text` as serde_json writes it (deepseek-recipe escapes string values with
// it): quote, backslash and control characters escaped, everything else as is.
void append_json_escaped(std::string_view text, std::string* out) {
  for (char c : text) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(c));
          *out += buf;
        } else {
          *out += c;
        }
    }
  }
}

// Appends a delta showing the fed bytes from `source` on, merged into the previous event when that
// is a delta of the same type that ends right there (so every delta's source range stays exact).
void push_delta(ParseEvent::Type type, std::string_view text, size_t source, std::vector<ParseEvent>* events) {
  if (text.empty()) return;
  if (!events->empty() && events->back().type == type && !events->back().collapsed &&
      events->back().source_end == source) {
    events->back().text.append(text);
  } else {
    ParseEvent delta{type, std::string(text), {}};
    delta.source_begin = source;
    events->push_back(std::move(delta));
  }
  events->back().source_end = source + text.size();
}

}  // namespace

CompletionParser::CompletionParser(ThinkingMode mode, ParseStart start) {
  // deepseek-recipe: a new assistant turn drops the newlines that begin it; a continuation keeps them.
  if (mode == ThinkingMode::kThinking && start == ParseStart::kContentContinuation) {
    enter({Stage::kContent, /*strip_leading_newlines=*/false});
  } else if (mode == ThinkingMode::kThinking && start == ParseStart::kReasoningContinuation) {
    enter({Stage::kReasoning, /*strip_leading_newlines=*/false});
  } else {
    enter({mode == ThinkingMode::kThinking ? Stage::kReasoning : Stage::kContent, /*strip_leading_newlines=*/true});
  }
}

void CompletionParser::set_parse_tool_calls(bool on) {
  parse_tool_calls_ = on;
  enter(stage_);  // the stage's markers depend on it
}

void CompletionParser::set_parse_json_output(bool on) {
  parse_json_output_ = on;
  enter(stage_);
}

void CompletionParser::add_stop_branches() {
  for (size_t i = 0; i < stop_units_.size(); ++i) {
    Branch b;
    b.match = Branch::Match::kMarker;
    b.pattern = &stop_units_[i];
    b.failure = &stop_failure_[i];
    b.next = {Stage::kFinished};
    b.action = {Action::Kind::kStop, "", i};
    branches_.push_back(b);
  }
}

void CompletionParser::set_stop_sequences(const std::vector<std::string>& stops) {
  stops_.clear();
  stop_units_.clear();
  stop_failure_.clear();
  for (const std::string& stop : stops) {
    if (stop.empty()) continue;
    stops_.push_back(stop);
    stop_units_.push_back(units_of({{stop, false}}));
    stop_failure_.push_back(failure_table(stop_units_.back()));
  }
  enter(stage_);
}

// Registers the stage's markers, in deepseek-recipe's order (the order decides which marker wins
// when two complete at the same byte).
void CompletionParser::enter(StageState next) {
  stage_ = next;
  branches_.clear();
  const Markers& m = markers();
  auto marker = [&](const Marker& mk, StageState to, Action action, Branch::Match match = Branch::Match::kMarker) {
    Branch b;
    b.match = match;
    b.pattern = &mk.units;
    b.failure = &mk.failure;
    b.next = to;
    b.action = action;
    branches_.push_back(b);
  };
  auto leading_newline = [&](StageState to) {
    Branch b;
    b.match = Branch::Match::kLeadingNewline;
    b.next = to;
    b.action = {Action::Kind::kSkip};
    branches_.push_back(b);
  };
  const Action skip{Action::Kind::kSkip};
  const Action label{Action::Kind::kArgumentsLabel};
  switch (next.stage) {
    case Stage::kContent:
      if (parse_json_output_) {
        // The JSON begins after a fence line or at its first bracket; stops are matched only in it.
        // A fence is tried before a bracket, though no fence holds one.
        marker(m.json_fence, {Stage::kJson}, skip);
        marker(m.plain_fence, {Stage::kJson}, skip);
        marker(m.brace, {Stage::kJson}, {Action::Kind::kLabel, "{"});
        marker(m.bracket, {Stage::kJson}, {Action::Kind::kLabel, "["});
      } else {
        add_stop_branches();  // first: a stop wins a tie with any marker
      }
      if (parse_tool_calls_) marker(m.dsml_open, {Stage::kToolCalls}, skip, Branch::Match::kNewlinesAndMarker);
      if (next.strip_leading_newlines) leading_newline({Stage::kContent, true});
      marker(m.think_end, {Stage::kContent, false}, skip);  // a stray </think> is dropped
      break;
    case Stage::kReasoning:
      if (parse_tool_calls_) marker(m.dsml_open, {Stage::kToolCalls}, skip, Branch::Match::kNewlinesAndMarker);
      if (next.strip_leading_newlines) leading_newline({Stage::kReasoning, true});
      marker(m.think_end, {Stage::kContent, true}, skip, Branch::Match::kNewlinesAndMarker);
      break;
    case Stage::kToolCalls:
      marker(m.invoke, {Stage::kToolName}, {Action::Kind::kCallBegin});
      marker(m.tool_calls_close, {Stage::kFinished}, skip);
      marker(m.calls_close, {Stage::kFinished}, skip);
      break;
    case Stage::kToolName:
      marker(m.quote, {Stage::kArguments, false, /*first_argument=*/true}, {Action::Kind::kCallNameEnd});
      break;
    case Stage::kArguments:
      marker(m.parameter, {Stage::kArgumentName}, {Action::Kind::kArgumentsLabel, next.first_argument ? "{" : ", "});
      marker(m.dsml_close, {Stage::kToolCalls}, {Action::Kind::kArgumentsEnd, next.first_argument ? "{}" : "}"});
      break;
    case Stage::kArgumentName: marker(m.space, {Stage::kStringAttribute}, {label.kind, ": "}); break;
    case Stage::kStringAttribute:
      marker(m.string_true, {Stage::kArgumentValue, false, false, /*string_value=*/true}, {label.kind, "\""});
      marker(m.string_false, {Stage::kArgumentValue, false, false, /*string_value=*/false}, skip);
      break;
    case Stage::kArgumentValue:
      marker(m.dsml_close, {Stage::kArguments, false, /*first_argument=*/false},
             next.string_value ? Action{label.kind, "\""} : skip);
      break;
    case Stage::kFinished: break;  // everything after the calls block is dropped
    case Stage::kJson:
      // Nothing but a stop or the closing fence ends the JSON: DSML and </think> in it are its text,
      // and bare JSON runs to the end of the answer unless a fence follows it.
      add_stop_branches();
      marker(m.json_close, {Stage::kAfterJson}, skip);
      break;
    case Stage::kAfterJson:
      // No newline stripping and no </think> rule here: such text becomes spaces like any other.
      if (parse_tool_calls_) marker(m.dsml_open, {Stage::kToolCalls}, skip, Branch::Match::kNewlinesAndMarker);
      break;
  }
}

Action CompletionParser::unmatched_action() const {
  switch (stage_.stage) {
    case Stage::kContent: return {parse_json_output_ ? Action::Kind::kToSpace : Action::Kind::kContent};
    case Stage::kJson: return {Action::Kind::kContent};
    case Stage::kAfterJson: return {Action::Kind::kToSpace};
    case Stage::kReasoning: return {Action::Kind::kReasoning};
    case Stage::kToolName: return {Action::Kind::kCallName};
    case Stage::kArgumentName: return {Action::Kind::kArgumentsRaw};
    case Stage::kArgumentValue:
      return {stage_.string_value ? Action::Kind::kArgumentsString : Action::Kind::kArgumentsRaw};
    default: return {Action::Kind::kSkip};
  }
}

// One byte through one branch's KMP match; true when the branch completed at this byte.
bool CompletionParser::advance(Branch& b, char byte, ChunkKind kind) const {
  if (b.match == Branch::Match::kLeadingNewline) {
    if (b.first_byte) b.leading_newline = byte == '\n';
    b.first_byte = false;
    return b.leading_newline;
  }
  const std::vector<PatternUnit>& p = *b.pattern;
  auto next_matched = [&](size_t matched) {
    auto fits = [&](size_t m) { return m < p.size() && unit_matches(p[m], byte, kind); };
    while (matched > 0 && !fits(matched)) matched = (*b.failure)[matched - 1];
    return fits(matched) ? matched + 1 : matched;
  };
  if (b.match == Branch::Match::kNewlinesAndMarker) {
    if (b.matched == 0 && byte == '\n') {
      ++b.newlines;
    } else {
      const size_t next = next_matched(b.matched);
      if (next <= b.matched) b.newlines = 0;  // the match restarted: the newlines were not before it
      b.matched = next;
    }
  } else {
    b.matched = next_matched(b.matched);
  }
  return b.matched == p.size();
}

size_t CompletionParser::matching_length(const Branch& b) {
  switch (b.match) {
    case Branch::Match::kLeadingNewline: return b.leading_newline ? 1 : 0;
    case Branch::Match::kNewlinesAndMarker: return b.matched + b.newlines;
    case Branch::Match::kMarker: return b.matched;
  }
  return 0;
}

// JSON output: `length` bytes at the buffer's front become spaces, one for each fed piece they
// overlap, except the piece a space was already written for when the run of such bytes goes on in
// it (deepseek-recipe writes a space per piece its stream processor takes, and it takes a run
// once per fed chunk).
void CompletionParser::to_spaces(size_t length, std::vector<ParseEvent>* events) {
  const size_t begin = fed_ - buffer_.size(), end = begin + length;
  auto next_start = piece_starts_.begin();  // every start is at or after `begin`
  bool new_piece = !last_was_space_;
  if (next_start != piece_starts_.end() && *next_start == begin) {
    new_piece = true;
    ++next_start;
  }
  for (size_t at = begin; at < end;) {
    const size_t to = next_start != piece_starts_.end() && *next_start < end ? *next_start++ : end;
    if (new_piece) {
      ParseEvent space{ParseEvent::Type::kContentDelta, " ", {}};
      space.source_begin = at;
      space.source_end = to;
      space.collapsed = true;
      events->push_back(std::move(space));
    }
    new_piece = true;
    at = to;
  }
}

void CompletionParser::apply(Action action, size_t length, std::vector<ParseEvent>* events) {
  const std::string_view bytes = std::string_view(buffer_).substr(0, length);
  const size_t begin = fed_ - buffer_.size();
  switch (action.kind) {
    case Action::Kind::kContent: push_delta(ParseEvent::Type::kContentDelta, bytes, begin, events); break;
    case Action::Kind::kToSpace: to_spaces(length, events); break;
    // The label is the matched byte itself, so the delta shows that byte.
    case Action::Kind::kLabel: push_delta(ParseEvent::Type::kContentDelta, action.label, begin, events); break;
    case Action::Kind::kReasoning: push_delta(ParseEvent::Type::kReasoningDelta, bytes, begin, events); break;
    case Action::Kind::kSkip: break;
    case Action::Kind::kCallBegin:
      call_open_ = true;
      call_named_ = false;
      call_name_.clear();
      call_arguments_.clear();
      break;
    case Action::Kind::kCallName: call_name_.append(bytes); break;
    case Action::Kind::kCallNameEnd: call_named_ = true; break;
    case Action::Kind::kArgumentsRaw: call_arguments_.append(bytes); break;
    case Action::Kind::kArgumentsString: append_json_escaped(bytes, &call_arguments_); break;
    case Action::Kind::kArgumentsLabel: call_arguments_ += action.label; break;
    case Action::Kind::kStop: events->push_back({ParseEvent::Type::kStop, stops_[action.stop], {}}); break;
    case Action::Kind::kArgumentsEnd:
      call_arguments_ += action.label;
      events->push_back({ParseEvent::Type::kToolCall, "", {std::move(call_name_), std::move(call_arguments_)}});
      call_open_ = call_named_ = false;
      call_name_.clear();
      call_arguments_.clear();
      break;
  }
  if (length == 0) return;
  last_was_space_ = action.kind == Action::Kind::kToSpace;
  const size_t next_begin = begin + length;
  while (!piece_starts_.empty() && piece_starts_.front() < next_begin) piece_starts_.pop_front();
  buffer_.erase(0, length);
}

std::vector<ParseEvent> CompletionParser::feed(std::string_view text, ChunkKind kind) {
  std::vector<ParseEvent> events;
  if (done_) return events;
  if (!text.empty()) piece_starts_.push_back(fed_);
  for (char byte : text) {
    buffer_.push_back(byte);
    ++fed_;
    for (size_t i = 0; i < branches_.size(); ++i) {
      Branch& b = branches_[i];
      if (!advance(b, byte, kind)) continue;
      // The bytes before the match take the stage's own action, the match the branch's.
      const size_t matched = matching_length(b);
      const Action action = b.action;
      const StageState next = b.next;
      if (stage_.stage == Stage::kReasoning && b.pattern == &markers().think_end.units) reasoning_end_ = fed_;
      apply(unmatched_action(), buffer_.size() - matched, &events);
      apply(action, matched, &events);
      enter(next);
      break;
    }
  }
  // Hold back only what may still grow into a marker.
  size_t hold = 0;
  for (const Branch& b : branches_) hold = std::max(hold, matching_length(b));
  if (buffer_.size() > hold) apply(unmatched_action(), buffer_.size() - hold, &events);
  return events;
}

std::vector<ParseEvent> CompletionParser::finish() {
  std::vector<ParseEvent> events;
  if (done_) return events;
  apply(unmatched_action(), buffer_.size(), &events);
  // deepseek-recipe reports a call from its name on; one cut before its end keeps what it has.
  if (call_open_ && call_named_)
    events.push_back({ParseEvent::Type::kToolCall, "", {std::move(call_name_), std::move(call_arguments_)}});
  call_open_ = call_named_ = false;
  done_ = true;
  events.push_back({ParseEvent::Type::kDone, "", {}});
  return events;
}

ParsedCompletion parse_completion(std::string_view text, ThinkingMode mode, bool parse_tool_calls) {
  const size_t eos = text.find(kEos);
  if (eos != std::string_view::npos) text = text.substr(0, eos);
  CompletionParser parser(mode);
  parser.set_parse_tool_calls(parse_tool_calls);
  ParsedCompletion out;
  std::vector<ParseEvent> events = parser.feed(text, ChunkKind::kText);
  for (auto& e : parser.finish()) events.push_back(std::move(e));
  for (auto& e : events) {
    switch (e.type) {
      case ParseEvent::Type::kReasoningDelta: out.reasoning_content += e.text; break;
      case ParseEvent::Type::kContentDelta: out.content += e.text; break;
      case ParseEvent::Type::kToolCall: out.tool_calls.push_back(std::move(e.tool_call)); break;
      case ParseEvent::Type::kStop:
      case ParseEvent::Type::kDone: break;
    }
  }
  return out;
}

}  // namespace cedar::chat
