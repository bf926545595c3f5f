// Helpers shared by the wire schemas (openai_schema, responses_schema, anthropic_schema): reading a
// request body safely and typed field access that answers a precise 400 (naming the field path)
// instead of throwing.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/api/api_error.h"
#include "serve/api/chat_types.h"

namespace cedar::serve {

// Every parse step returns nothing on success or the error to send.
using SchemaError = std::optional<ApiError>;

#define CEDAR_SCHEMA_TRY(expr)                    \
  do {                                            \
    if (::cedar::serve::SchemaError _cedar_e = (expr)) return _cedar_e; \
  } while (0)

// Deepest nesting a request body may have. Bodies nest a few levels (messages -> content parts ->
// tool schemas); JSON schemas of tools rarely pass 20. The limit keeps recursive code (dump, the
// encoder's schema printing) far from the stack's end on hostile input.
inline constexpr int kMaxJsonDepth = 64;

// Parses a request body into an insertion-ordered JSON object: malformed JSON, invalid UTF-8, a
// top level that is not an object, or nesting deeper than kMaxJsonDepth are 400s.
// The parse is linear in the body with json_body.h's default limits (keys per object, values, string
// bytes, memory), each a 400 naming it; `cancelled` (the client left) is polled while it runs.
SchemaError parse_body(std::string_view body, OrderedJson* out, const std::function<bool()>& cancelled = {});
// The nesting depth of a JSON text (brackets outside strings), without parsing it.
int json_nesting_depth(std::string_view text);

// Serialises a response value: compact, UTF-8 kept as is (invalid bytes, which cedar never
// produces, become U+FFFD rather than an exception).
std::string to_wire(const OrderedJson& value);

// "param" paths in errors: field_path("messages", 2) == "messages[2]", field_path("a", "b") == "a.b".
std::string field_path(const std::string& parent, size_t index);
std::string field_path(const std::string& parent, const char* key);

// Typed reads of obj[key] (obj is an object). A missing key leaves *out untouched unless `required`.
SchemaError read_string(const OrderedJson& obj, const char* key, const std::string& path, std::string* out,
                        bool required = false);
SchemaError read_bool(const OrderedJson& obj, const char* key, const std::string& path, bool* out);
SchemaError read_int(const OrderedJson& obj, const char* key, const std::string& path, int64_t lo, int64_t hi,
                     std::optional<int64_t>* out);
SchemaError read_number(const OrderedJson& obj, const char* key, const std::string& path, double lo, double hi,
                        std::optional<double>* out);

// Text of a content field that may be a string, null, or an array of text parts whose "type" is
// one of `text_types` (e.g. {"text"} or {"input_text", "output_text"}), joined with a blank line as
// the V4.1 encoder joins text blocks. Other part types (images, audio, files) are a 400 naming the
// type: cedar serves a text model.
SchemaError read_text_content(const OrderedJson& content, const std::string& path,
                              const std::vector<std::string_view>& text_types, std::string* out);

// An image part's base64 data URL: OpenAI's image_url ({"url"} or a string), Responses' input_image
// ("image_url"), Anthropic's image ({"source": {"type": "base64", "media_type", "data"}}). A remote
// URL (http, https, an Anthropic url source, a file id) is a 400: the server fetches nothing for a client.
SchemaError read_image_part(const OrderedJson& part, const std::string& type, const std::string& path,
                            std::string* url);

// read_text_content that also takes image parts of `image_types` (read_image_part): with any image,
// out->content_blocks holds the text and image blocks in order, and out->content the joined text.
SchemaError read_user_content(const OrderedJson& content, const std::string& path,
                              const std::vector<std::string_view>& text_types,
                              const std::vector<std::string_view>& image_types, Message* out);

// Stop strings: a string or an array of at most `max_count` non-empty strings.
SchemaError read_stop(const OrderedJson& value, const std::string& path, size_t max_count,
                      std::vector<std::string>* out);

// A reasoning effort given as a word (minimal, low, medium, high, xhigh, max; "none" turns thinking
// off) or, cedar's extension, an integer 1..100 passed to V4.1 as is. Sets reasoning->effort and,
// for "none", reasoning->thinking = false; any effort other than "none" turns thinking on.
SchemaError read_effort(const OrderedJson& value, const std::string& path, ReasoningOptions* reasoning);

// The same from command-line text: digits are the integer form, anything else a word.
SchemaError read_effort_text(const std::string& text, ReasoningOptions* reasoning);

// Checks the arguments of a tool call in the history. Any text is accepted, as deepseek-recipe accepts
// it (text that is not a JSON object is rendered as one "arguments" string parameter); only JSON
// nested deeper than kMaxJsonDepth or over json_body.h's limits is refused, so later parses stay bounded.
SchemaError check_history_arguments(const std::string& arguments, const std::string& path);

// A fresh identifier: prefix + 24 random alphanumerics ("chatcmpl-9xQ...").
std::string random_id(std::string_view prefix);
int64_t unix_seconds_now();

}  // namespace cedar::serve
