#include "serve/api/output_assembler.h"

#include <algorithm>
#include <utility>

#include "chat/chat_encoding.h"
#include "core/log.h"
#include "serve/api/schema_util.h"
#include "tokenizer/marker_tokens.h"

namespace cedar::serve {
namespace {

// Bytes at the end of `s` that belong to a UTF-8 character whose last byte is not there yet.
size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for the lead byte
    const size_t need = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

OutputAssembler::OutputAssembler(const tokenizer::Tokenizer& tokenizer, OutputSettings settings, StreamSink* sink)
    : tokenizer_(tokenizer),
      settings_(std::move(settings)),
      sink_(sink),
      decoder_(tokenizer, /*skip_special=*/settings_.mode == OutputMode::kRaw),
      parser_(settings_.thinking, settings_.parse_start),
      eos_id_(tokenizer.token_to_id(tokenizer::kEos)) {
  parser_.set_parse_tool_calls(settings_.parse_tool_calls);
  parser_.set_parse_json_output(settings_.mode == OutputMode::kChat && settings_.parse_json_output);
  // A chat turn's stop sequences are matched by the parser (in the answer, before the DSML opening,
  // never against a special token's text: deepseek-recipe's rules); raw completions match them here.
  if (settings_.mode == OutputMode::kChat) parser_.set_stop_sequences(settings_.stop);
  for (const tokenizer::AddedToken& t : tokenizer.added_tokens()) added_.emplace(t.id, t.content);
  for (const std::string& s : settings_.stop) longest_stop_ = std::max(longest_stop_, s.size());
}

void OutputAssembler::push(int32_t token, const runtime::TokenLogprobs& logprobs, size_t index) {
  feed_output_prefix();  // before the first span starts: the prefix is prompt text, not this token's
  if (settings_.logprobs && index < logprobs.size()) {
    ids_.push_back(token);
    spans_.push_back({decoded_.size(), decoded_.size()});  // the end is set once the token is decoded
    const size_t k = static_cast<size_t>(logprobs.k);
    probs_.k = logprobs.k;
    probs_.logprob.push_back(logprobs.logprob[index]);
    probs_.top_ids.insert(probs_.top_ids.end(), logprobs.top_ids.begin() + index * k,
                          logprobs.top_ids.begin() + (index + 1) * k);
    probs_.top_logprobs.insert(probs_.top_logprobs.end(), logprobs.top_logprobs.begin() + index * k,
                               logprobs.top_logprobs.begin() + (index + 1) * k);
  }
  push(token);
}

void OutputAssembler::feed_output_prefix() {
  if (prefix_fed_) return;
  prefix_fed_ = true;
  if (settings_.output_prefix.empty() || settings_.mode == OutputMode::kRaw) return;
  decoded_ += settings_.output_prefix;
  // The prefix is the prompt's own markup: its markers are the special tokens they spell.
  for (const chat::ParseEvent& e : parser_.feed(settings_.output_prefix, chat::ChunkKind::kText)) handle(e);
}

void OutputAssembler::push(int32_t token) {
  feed_output_prefix();
  ++tokens_;
  if (wants_stop() || parser_done_ || ended_) return;
  // The end-of-sentence token ends the turn (the engine stops on it); it is no text of the turn, as
  // a backend reports it to deepseek-recipe as the end of the stream.
  if (eos_id_ && token == *eos_id_) {
    ended_ = true;
    return;
  }
  auto text = decoder_.push(token);
  if (!text.ok()) {  // an id outside the vocabulary: an engine bug, reported as a failed turn
    failure_ = "the engine produced token id " + std::to_string(token) + ": " + text.status().message();
    return;
  }
  if (text->empty()) return;
  decoded_ += *text;
  // This token's span: the text it completed (before the parser may emit it as content).
  if (spans_.size() == static_cast<size_t>(tokens_)) spans_.back().end = decoded_.size();
  if (settings_.mode == OutputMode::kRaw) {
    content_text(*text);
    return;
  }
  feed_parser(token, *text);
}

void OutputAssembler::feed_parser(int32_t token, std::string_view text) {
  // A marker's special-token part matches only that token, as deepseek-recipe decodes each added
  // token as its own piece. (Under a DSML grammar too: the grammar reaches the marker only through
  // its token, constrain/grammar_engine.cc.) A special token's text may follow the replacement
  // character of plain bytes it cut short; those bytes are plain text.
  const auto added = added_.find(token);
  if (added == added_.end() || !text.ends_with(added->second)) {
    for (const chat::ParseEvent& e : parser_.feed(text, chat::ChunkKind::kPlainTokens)) handle(e);
    return;
  }
  const std::string_view plain = text.substr(0, text.size() - added->second.size());
  for (const chat::ParseEvent& e : parser_.feed(plain, chat::ChunkKind::kPlainTokens)) handle(e);
  for (const chat::ParseEvent& e : parser_.feed(added->second, chat::ChunkKind::kSpecialToken)) handle(e);
}

void OutputAssembler::handle(const chat::ParseEvent& event) {
  if (stop_matched_) return;
  switch (event.type) {
    case chat::ParseEvent::Type::kReasoningDelta:
      turn_.reasoning += event.text;
      if (sink_) sink_->on_reasoning(event.text);
      break;
    case chat::ParseEvent::Type::kContentDelta: emit_content(event.text, &event); break;
    case chat::ParseEvent::Type::kToolCall: {
      flush_held_content();  // a stop string cannot span a tool call
      ToolCall call{random_id(settings_.tool_id_prefix), event.tool_call.name, event.tool_call.arguments};
      if (sink_) sink_->on_tool_call(turn_.tool_calls.size(), call);
      turn_.tool_calls.push_back(std::move(call));
      break;
    }
    case chat::ParseEvent::Type::kStop:
      turn_.matched_stop = event.text;
      stop_matched_ = true;
      break;
    case chat::ParseEvent::Type::kDone: parser_done_ = true; break;
  }
}

void OutputAssembler::content_text(std::string_view text) {
  if (longest_stop_ == 0 || settings_.mode == OutputMode::kChat) {
    emit_content(text);
    return;
  }
  held_content_ += text;
  size_t first = std::string::npos, which = 0;
  for (size_t i = 0; i < settings_.stop.size(); ++i) {
    const size_t p = held_content_.find(settings_.stop[i]);
    if (p < first) first = p, which = i;
  }
  if (first != std::string::npos) {
    emit_content(std::string_view(held_content_).substr(0, first));
    held_content_.clear();
    turn_.matched_stop = settings_.stop[which];
    stop_matched_ = true;
    return;
  }
  // Keep the last longest_stop - 1 bytes (a stop string may begin there), cut on a character
  // boundary so every delta is valid UTF-8.
  if (held_content_.size() < longest_stop_) return;
  size_t release = held_content_.size() - (longest_stop_ - 1);
  release -= incomplete_utf8_tail(std::string_view(held_content_).substr(0, release));
  emit_content(std::string_view(held_content_).substr(0, release));
  held_content_.erase(0, release);
}

void OutputAssembler::emit_content(std::string_view text, const chat::ParseEvent* event) {
  if (text.empty()) return;
  const size_t reported = turn_.logprobs.size();
  if (settings_.logprobs && event) {
    // The parser says which fed bytes (== decoded_) the delta shows; a space standing for text
    // around JSON output shows the tokens of that text, as deepseek-recipe reports them with it.
    report_tokens(event->source_begin, event->source_end, event->collapsed);
  } else if (settings_.logprobs) {
    // Raw mode: the content is the decoded text in order, each delta the next occurrence of its
    // text in decoded_.
    const size_t at = decoded_.find(text, content_cursor_);
    if (at != std::string::npos) {
      report_tokens(at, at + text.size());
      content_cursor_ = at + text.size();
    }
  }
  turn_.content += text;
  if (sink_) sink_->on_content(text, std::span<const TokenLogprob>(turn_.logprobs).subspan(reported));
}

void OutputAssembler::report_tokens(size_t from, size_t to, bool collapsed) {
  const size_t k = static_cast<size_t>(probs_.k);
  auto spell = [&](int32_t id) {
    if (tokenizer_.has_byte_level_decoder()) return std::string(tokenizer_.token_bytes(id));
    return tokenizer_.decode_token_raw(id);
  };
  for (; next_report_ < spans_.size() && spans_[next_report_].start < to; ++next_report_) {
    const TokenSpan span = spans_[next_report_];
    const bool shows_text = span.start == span.end ? span.start >= from : span.end > from;
    if (!shows_text) continue;  // markup or reasoning before this delta
    TokenLogprob entry;
    entry.chosen = {spell(ids_[next_report_]), probs_.logprob[next_report_]};
    for (size_t j = 0; j < k; ++j)
      entry.top.push_back({spell(probs_.top_ids[next_report_ * k + j]), probs_.top_logprobs[next_report_ * k + j]});
    entry.text_offset =
        static_cast<int>(turn_.content.size() + (span.start > from && !collapsed ? span.start - from : 0));
    turn_.logprobs.push_back(std::move(entry));
  }
}

void OutputAssembler::flush_held_content() {
  std::string held;
  held.swap(held_content_);
  emit_content(held);
}

std::optional<ApiError> OutputAssembler::finish(const runtime::GenerationResult& result, Completion* turn) {
  feed_output_prefix();
  const bool truncated = result.finish_reason == runtime::FinishReason::kLength;
  if (!wants_stop() && !parser_done_) {
    // The bytes of a character cut short (a budget ended mid-character): the raw completion shows
    // them as U+FFFD; a chat turn drops them, as deepseek-recipe's decoder drops the ids it still
    // buffers when the stream ends.
    std::string tail = decoder_.finish();
    if (!tail.empty() && settings_.mode == OutputMode::kRaw) {
      decoded_ += tail;
      content_text(tail);
    }
    if (settings_.mode == OutputMode::kChat && !wants_stop())
      for (const chat::ParseEvent& e : parser_.finish()) handle(e);
  }
  if (!stop_matched_) flush_held_content();

  turn->content = std::move(turn_.content);
  turn->reasoning = std::move(turn_.reasoning);
  turn->tool_calls = std::move(turn_.tool_calls);
  turn->matched_stop = turn_.matched_stop;
  turn->has_logprobs = settings_.logprobs;
  turn->logprobs = std::move(turn_.logprobs);
  turn->usage.prompt_tokens = result.prompt_tokens;
  turn->usage.completion_tokens = static_cast<int>(result.output_ids.size());
  turn->usage.cached_tokens = result.cached_tokens;
  if (settings_.mode == OutputMode::kChat && settings_.thinking == chat::ThinkingMode::kThinking) {
    // deepseek-recipe's count: the tokens the reasoning text encodes to (without BOS/EOS), whatever
    // ended it (the </think> token, tool calls opened inside it, the budget).
    const auto ids = tokenizer_.encode(turn->reasoning, /*add_special=*/false);
    turn->usage.reasoning_tokens = ids.ok() ? static_cast<int>(ids->size()) : 0;
  }

  if (stop_matched_) {
    turn->finish = FinishKind::kStop;
  } else if (failure_) {  // the engine produced an id outside the vocabulary
    turn->finish = FinishKind::kError;
    CEDAR_LOG_WARN("serve: %s", failure_->c_str());
    return ApiError{ErrorKind::kInternal, *failure_ + "; the turn was discarded, retry the request", ""};
  } else if (truncated) {
    turn->finish = FinishKind::kLength;
  } else if (result.finish_reason == runtime::FinishReason::kCancelled) {
    turn->finish = FinishKind::kCancelled;
  } else {
    turn->finish = turn->tool_calls.empty() ? FinishKind::kStop : FinishKind::kToolCalls;
  }
  return std::nullopt;
}

std::optional<std::string> OutputAssembler::raw_after_reasoning() const {
  std::string_view text = decoded_;  // the parser was fed exactly decoded_
  if (settings_.thinking == chat::ThinkingMode::kThinking) {
    // Where the parser read the `</think>` token (a spelled one inside the reasoning is text). A turn
    // whose calls opened inside the reasoning has no answer part to replay.
    const std::optional<size_t> end = parser_.reasoning_end();
    if (!end) return std::nullopt;
    text = text.substr(*end);
  }
  return std::string(text);  // the end-of-sentence token never enters decoded_
}

}  // namespace cedar::serve
