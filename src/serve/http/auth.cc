#include "serve/http/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cctype>
#include <cstdio>

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

std::optional<std::string> api_key_problem(std::string_view key) {
  constexpr std::string_view kBom = "\xEF\xBB\xBF";
  if (key.rfind(kBom, 0) == 0) return "starts with a UTF-8 byte-order mark (bytes EF BB BF); save it without one";
  if (key.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return "is blank; give the key itself (e.g. the output of `openssl rand -hex 32`)";
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", c);
    if (c < 0x20 || c == 0x7F)
      return std::string("contains the control character ") + hex + (c == '\n' || c == '\r' ? " (a line break)" : "") +
             " at byte " + std::to_string(i) + ", which no HTTP header can carry; use printable ASCII only";
    if (c > 0x7E)
      return std::string("contains the non-ASCII byte ") + hex + " at byte " + std::to_string(i) +
             ", which HTTP clients do not send in a header; use printable ASCII only";
  }
  if (key.front() == ' ' || key.back() == ' ')
    return "begins or ends with a space, which HTTP drops from a header; remove it";
  return std::nullopt;
}

namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

bool is_port(std::string_view s) {
  if (s.empty() || s.size() > 5) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

}  // namespace

bool is_loopback_authority(std::string_view host) {
  std::string_view name = host;
  if (!host.empty() && host.front() == '[') {  // [v6]:port
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    name = host.substr(0, close + 1);
    std::string_view rest = host.substr(close + 1);
    if (!rest.empty() && (rest.front() != ':' || !is_port(rest.substr(1)))) return false;
  } else if (const size_t colon = host.find(':'); colon != std::string_view::npos) {
    if (!is_port(host.substr(colon + 1))) return false;
    name = host.substr(0, colon);
  }
  return iequals(name, "localhost") || name == "127.0.0.1" || name == "[::1]";
}

bool is_loopback_origin(std::string_view origin) {
  for (std::string_view scheme : {std::string_view("http://"), std::string_view("https://")}) {
    if (origin.size() > scheme.size() && iequals(origin.substr(0, scheme.size()), scheme)) {
      std::string_view authority = origin.substr(scheme.size());
      if (!authority.empty() && authority.back() == '/') authority.remove_suffix(1);
      return is_loopback_authority(authority);
    }
  }
  return false;  // "null" (sandboxed pages, file://) and anything else
}

bool is_json_media_type(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
  return iequals(type, "application/json");
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
