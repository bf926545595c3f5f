#include "kv_tier_flags.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "cedar/platform.h"

namespace cedar::cli {

Status kv_tier_from_flags(const Args& args, kv::RedisTierOptions* out) {
  if (!args.has("--kv-tier")) {
    if (args.has("--kv-tier-password-file") || args.has("--kv-tier-timeout"))
      return invalid_argument("--kv-tier-password-file and --kv-tier-timeout need --kv-tier URL");
    return {};
  }
  out->url = args.get_or("--kv-tier", "");
  CEDAR_ASSIGN_OR_RETURN(const kv::RedisEndpoint endpoint, kv::parse_redis_url(out->url));
  if (!endpoint.password.empty())
    CEDAR_LOG_WARN(
        "--kv-tier: the URL carries a password, which `ps` shows to every user; prefer "
        "--kv-tier-password-file FILE or the CEDAR_KV_TIER_PASSWORD environment variable");
  if (args.has("--kv-tier-password-file")) {
    const std::string path = args.get_or("--kv-tier-password-file", "");
    std::ifstream in(path);
    if (!in)
      return invalid_argument("--kv-tier-password-file '" + path +
                              "' cannot be read; give a file holding the password");
    std::string password;
    std::getline(in, password);
    while (!password.empty() && (password.back() == '\r' || password.back() == ' ' || password.back() == '\t'))
      password.pop_back();
    if (password.empty())
      return invalid_argument("--kv-tier-password-file '" + path +
                              "' starts with an empty line; put the password on its first line");
    out->password = password;
  } else if (const char* env = std::getenv("CEDAR_KV_TIER_PASSWORD"); env && *env) {
    out->password = env;
  }
  CEDAR_ASSIGN_OR_RETURN(const long long timeout_ms, args.get_int("--kv-tier-timeout", out->command_timeout_ms));
  if (timeout_ms < 1 || timeout_ms > 600000) return invalid_argument("--kv-tier-timeout must be 1..600000 ms");
  out->command_timeout_ms = static_cast<int>(timeout_ms);
  out->connect_timeout_ms = std::min(out->connect_timeout_ms, out->command_timeout_ms);
  return {};
}

}  // namespace cedar::cli
