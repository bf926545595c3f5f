#include "serve/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "core/check.h"

namespace cedar::serve {
namespace {

std::array<unsigned char, 32> sha256(std::string_view data) {
  std::array<unsigned char, 32> digest{};
  unsigned int length = 0;
  const int ok = EVP_Digest(data.data(), data.size(), digest.data(), &length, EVP_sha256(), nullptr);
  CEDAR_CHECK(ok == 1 && length == digest.size(), "EVP_Digest(SHA-256) failed");
  return digest;
}

}  // namespace

ApiKeyCheck::ApiKeyCheck(const std::string& key) : enabled_(!key.empty()) {
  if (enabled_) digest_ = sha256(key);
}

bool ApiKeyCheck::accepts(std::string_view presented) const {
  if (!enabled_) return true;
  const std::array<unsigned char, 32> digest = sha256(presented);
  return CRYPTO_memcmp(digest.data(), digest_.data(), digest.size()) == 0;
}

std::string_view presented_key(std::string_view authorization, std::string_view x_api_key) {
  constexpr std::string_view kBearer = "bearer ";
  if (authorization.size() > kBearer.size()) {
    bool is_bearer = true;
    for (size_t i = 0; i < kBearer.size(); ++i)
      is_bearer &= (authorization[i] | 0x20) == kBearer[i];  // ASCII case-insensitive
    if (is_bearer) return authorization.substr(kBearer.size());
  }
  return x_api_key;
}

}  // namespace cedar::serve
