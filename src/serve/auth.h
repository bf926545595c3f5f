// API key check: the key a client presents (OpenAI's "Authorization: Bearer KEY" or Anthropic's
// "x-api-key: KEY") against the server's, compared in constant time. Both sides are hashed with
// SHA-256 first and the digests compared with OpenSSL's CRYPTO_memcmp, so neither the content nor
// the length of the configured key leaks through response timing.
#pragma once

#include <array>
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

// The key from the request headers: "Bearer KEY" in Authorization (scheme case-insensitive),
// else x-api-key; empty when neither is present.
std::string_view presented_key(std::string_view authorization, std::string_view x_api_key);

}  // namespace cedar::serve
