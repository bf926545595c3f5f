#include "serve/api/api_error.h"

namespace cedar::serve {

int ApiError::http_status() const {
  switch (kind) {
    case ErrorKind::kInvalidRequest: return 400;
    case ErrorKind::kContextTooLong: return 400;
    case ErrorKind::kAuthentication: return 401;
    case ErrorKind::kForbidden: return 403;
    case ErrorKind::kNotFound: return 404;
    case ErrorKind::kRequestTooLarge: return 413;
    case ErrorKind::kUnsupportedMediaType: return 415;
    case ErrorKind::kRateLimited:
    case ErrorKind::kTokenRateLimited: return 429;
    case ErrorKind::kOverloaded: return 503;
    case ErrorKind::kInternal: return 500;
  }
  return 500;
}

const char* ApiError::openai_type() const {
  switch (kind) {
    case ErrorKind::kInvalidRequest:
    case ErrorKind::kContextTooLong:
    case ErrorKind::kRequestTooLarge:
    case ErrorKind::kUnsupportedMediaType: return "invalid_request_error";
    case ErrorKind::kForbidden: return "permission_error";
    case ErrorKind::kAuthentication: return "authentication_error";
    case ErrorKind::kNotFound: return "not_found_error";
    case ErrorKind::kRateLimited: return "rate_limit_error";
    case ErrorKind::kTokenRateLimited: return "tokens";  // what OpenAI sends for a TPM limit
    case ErrorKind::kOverloaded: return "server_overloaded";
    case ErrorKind::kInternal: return "server_error";
  }
  return "server_error";
}

const char* ApiError::openai_code() const {
  switch (kind) {
    case ErrorKind::kContextTooLong: return "context_length_exceeded";
    case ErrorKind::kAuthentication: return "invalid_api_key";
    case ErrorKind::kRateLimited:
    case ErrorKind::kTokenRateLimited: return "rate_limit_exceeded";
    case ErrorKind::kRequestTooLarge: return "request_too_large";
    default: return nullptr;
  }
}

const char* ApiError::anthropic_type() const {
  switch (kind) {
    case ErrorKind::kInvalidRequest:
    case ErrorKind::kContextTooLong:
    case ErrorKind::kUnsupportedMediaType: return "invalid_request_error";
    case ErrorKind::kAuthentication: return "authentication_error";
    case ErrorKind::kForbidden: return "permission_error";
    case ErrorKind::kNotFound: return "not_found_error";
    case ErrorKind::kRequestTooLarge: return "request_too_large";
    case ErrorKind::kRateLimited:
    case ErrorKind::kTokenRateLimited: return "rate_limit_error";
    case ErrorKind::kOverloaded: return "overloaded_error";
    case ErrorKind::kInternal: return "api_error";
  }
  return "api_error";
}

ApiError api_error_from_status(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument: return {ErrorKind::kInvalidRequest, status.message(), ""};
    case StatusCode::kResourceExhausted: return {ErrorKind::kRateLimited, status.message(), ""};
    case StatusCode::kFailedPrecondition: return {ErrorKind::kOverloaded, status.message(), ""};
    case StatusCode::kUnimplemented: return {ErrorKind::kInvalidRequest, status.message(), ""};
    default: return {ErrorKind::kInternal, status.to_string(), ""};
  }
}

}  // namespace cedar::serve
