// API key check: the key a client presents (OpenAI's "Authorization: Bearer KEY" or Anthropic's
// "x-api-key: KEY") against the server's, compared in constant time. Both sides are hashed with
// SHA-256 first and the digests compared with OpenSSL's CRYPTO_memcmp, so neither the content nor
// the length of the configured key leaks through response timing.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace cedar::serve {

class ApiKeyCheck {
 public:
  explicit ApiKeyCheck(const std::string& key);  // an empty key disables the check
  bool enabled() const { return enabled_; }
  bool accepts(std::string_view presented) const;

 private:
  bool enabled_ = false;
  std::array<unsigned char, 32> digest_{};
};

// What makes `key` unusable as an API key, or nothing when it is fine. Clients send the key in an
// HTTP header, which cannot carry control characters (a newline from a key file), drops leading and
// trailing blanks, and is ASCII in the SDKs; a server started with such a key would refuse everyone.
// So a key must be non-empty printable ASCII (0x20-0x7E) without blanks at either end; a UTF-8
// byte-order mark (which Windows editors put at the start of a file) is named as such.
std::optional<std::string> api_key_problem(std::string_view key);

// Local-exposure checks for a server without an API key (docs/SERVER.md, "Security defaults"). A
// web page the user visits can POST to a loopback server (CSRF) with a "simple" content type, and a
// DNS-rebinding page can read the answers under its own host name; browsers always send the page's
// Host and, for cross-origin requests, its Origin. Accepting only JSON bodies (which a page cannot
// send cross-origin without a CORS preflight, which this server never approves) and only loopback
// names closes both.
//
// True for "localhost", "127.0.0.1" and "[::1]", each with or without ":PORT" (case-insensitive).
bool is_loopback_authority(std::string_view host);
// True for an Origin of http:// or https:// followed by a loopback authority.
bool is_loopback_origin(std::string_view origin);
// True for "application/json" with or without parameters ("; charset=utf-8"), case-insensitive.
bool is_json_media_type(std::string_view content_type);

// The key from the request headers: "Bearer KEY" in Authorization (scheme case-insensitive),
// else x-api-key; empty when neither is present.
std::string_view presented_key(std::string_view authorization, std::string_view x_api_key);

}  // namespace cedar::serve
