// ApiError: what the server tells a client that a request failed. One neutral form, rendered as an
// OpenAI error body ({"error": {...}}) or an Anthropic one ({"type": "error", "error": {...}})
// by the schema files, depending on the endpoint.
#pragma once

#include <string>

#include "core/status.h"

namespace cedar::serve {

enum class ErrorKind {
  kInvalidRequest,   // 400: malformed JSON, schema violation, unsupported option
  kContextTooLong,   // 400: the prompt (plus max tokens) does not fit the model's context
  kAuthentication,   // 401: missing or wrong API key
  kForbidden,        // 403: a browser-reachable request refused by the local-exposure checks
  kNotFound,         // 404: unknown route
  kRequestTooLarge,  // 413: body over --max-body-bytes
  kUnsupportedMediaType,  // 415: a POST body that is not JSON
  kRateLimited,      // 429: the queue is full; Retry-After says when to come back
  kTokenRateLimited, // 429: the key's tokens per minute are spent (OpenAI type "tokens")
  kOverloaded,       // 503: the engine is out of memory / shutting down
  kInternal,         // 500: a bug or an engine failure that is not the client's fault
};

struct ApiError {
  ErrorKind kind = ErrorKind::kInvalidRequest;
  std::string message;
  std::string param;  // the offending field ("messages[2].content"), empty when none

  int http_status() const;
  // OpenAI's error "type" ("invalid_request_error", ...).
  const char* openai_type() const;
  // OpenAI's error "code" ("context_length_exceeded", "rate_limit_exceeded", ...) or nullptr.
  const char* openai_code() const;
  // Anthropic's error "type" ("invalid_request_error", "rate_limit_error", ...).
  const char* anthropic_type() const;
};

inline ApiError invalid_request(std::string message, std::string param = "") {
  return {ErrorKind::kInvalidRequest, std::move(message), std::move(param)};
}

// Maps an engine / tokenizer Status onto what the client sees: InvalidArgument -> 400,
// ResourceExhausted -> 429, FailedPrecondition -> 503, anything else -> 500.
ApiError api_error_from_status(const Status& status);

}  // namespace cedar::serve
