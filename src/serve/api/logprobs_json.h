// The wire forms of per-token log-probabilities (TokenLogprob), shared by the OpenAI endpoints:
//   Chat Completions and Responses: [{"token", "logprob", "bytes", "top_logprobs": [{"token",
//   "logprob", "bytes"}]}]; legacy Completions: {"tokens", "token_logprobs", "top_logprobs",
//   "text_offset"}.
// A token whose bytes are not whole UTF-8 characters is spelled "bytes:\xNN..." as OpenAI does; its
// "bytes" array holds the raw bytes either way.
#pragma once

#include <span>
#include <string>

#include "serve/api/chat_types.h"

namespace cedar::serve {

// `with_bytes` false: the shape of Responses' output_text.delta / .done events, which carry no
// "bytes" (OpenAI's ResponseTextDeltaEvent.Logprob).
OrderedJson token_logprob_entries(std::span<const TokenLogprob> tokens, bool with_bytes = true);
OrderedJson legacy_logprobs(std::span<const TokenLogprob> tokens);

}  // namespace cedar::serve
