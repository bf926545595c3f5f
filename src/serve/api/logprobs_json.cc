#include "serve/api/logprobs_json.h"

#include <cstdio>

#include "tokenizer/utf8.h"

namespace cedar::serve {
namespace {

std::string token_spelling(const std::string& bytes) {
  if (tokenizer::is_valid_utf8(bytes)) return bytes;
  std::string out = "bytes:";
  char hex[5];
  for (unsigned char c : bytes) {
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += hex;
  }
  return out;
}

OrderedJson byte_array(const std::string& bytes) {
  OrderedJson out = OrderedJson::array();
  for (unsigned char c : bytes) out.push_back(static_cast<int>(c));
  return out;
}

OrderedJson choice_json(const TokenChoice& c, bool with_bytes) {
  OrderedJson out = {{"token", token_spelling(c.bytes)}, {"logprob", c.logprob}};
  if (with_bytes) out["bytes"] = byte_array(c.bytes);
  return out;
}

}  // namespace

OrderedJson token_logprob_entries(std::span<const TokenLogprob> tokens, bool with_bytes) {
  OrderedJson out = OrderedJson::array();
  for (const TokenLogprob& t : tokens) {
    OrderedJson entry = choice_json(t.chosen, with_bytes);
    OrderedJson top = OrderedJson::array();
    for (const TokenChoice& c : t.top) top.push_back(choice_json(c, with_bytes));
    entry["top_logprobs"] = std::move(top);
    out.push_back(std::move(entry));
  }
  return out;
}

OrderedJson legacy_logprobs(std::span<const TokenLogprob> tokens) {
  OrderedJson spelled = OrderedJson::array(), logprobs = OrderedJson::array(), top = OrderedJson::array(),
              offsets = OrderedJson::array();
  for (const TokenLogprob& t : tokens) {
    spelled.push_back(token_spelling(t.chosen.bytes));
    logprobs.push_back(t.chosen.logprob);
    OrderedJson alternatives = OrderedJson::object();
    for (const TokenChoice& c : t.top) alternatives[token_spelling(c.bytes)] = c.logprob;
    top.push_back(std::move(alternatives));
    offsets.push_back(t.text_offset);
  }
  return {{"tokens", std::move(spelled)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

}  // namespace cedar::serve
