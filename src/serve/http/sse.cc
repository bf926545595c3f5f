#include "serve/http/sse.h"

namespace cedar::serve {
namespace {

// Appends `prefix` + one line per line of `text` (split on \n, \r\n or \r, which the format treats
// as line ends), so a payload with line breaks cannot end the event early or forge another field.
void append_lines(std::string& out, std::string_view prefix, std::string_view text) {
  size_t start = 0;
  for (;;) {
    size_t end = text.find_first_of("\r\n", start);
    out += prefix;
    out += text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    out += '\n';
    if (end == std::string_view::npos) return;
    start = end + 1;
    if (text[end] == '\r' && start < text.size() && text[start] == '\n') ++start;
  }
}

}  // namespace

std::string sse_data(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 8);
  append_lines(out, "data: ", data);
  out += '\n';
  return out;
}

std::string sse_event(std::string_view name, std::string_view data) {
  std::string out;
  out.reserve(name.size() + data.size() + 16);
  append_lines(out, "event: ", name);
  append_lines(out, "data: ", data);
  out += '\n';
  return out;
}

std::string sse_comment(std::string_view text) {
  std::string out;
  append_lines(out, ": ", text);
  out += '\n';
  return out;
}

}  // namespace cedar::serve
