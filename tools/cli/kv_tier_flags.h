// --kv-tier and its credentials, shared by serve, chat and generate: the prefix cache's shared third
// level (kv/redis_tier.h, docs/KV.md).
#pragma once

#include "args.h"
#include "cedar/status.h"
#include "cedar/engine.h"

namespace cedar::cli {

inline constexpr const char* kKvTierFlags[] = {"--kv-tier", "--kv-tier-password-file", "--kv-tier-timeout"};

inline constexpr const char* kKvTierUsage =
    "  --kv-tier URL          share the prefix cache through Redis: redis://[user@]HOST:PORT[/DB] (the\n"
    "                         password from --kv-tier-password-file or CEDAR_KV_TIER_PASSWORD; docs/KV.md)\n"
    "  --kv-tier-password-file FILE   the Redis password, on the file's first line\n"
    "  --kv-tier-timeout MS   deadline of each Redis socket operation (default 1000)\n";

// Fills `out` from the flags and the environment; leaves it empty without --kv-tier.
Status kv_tier_from_flags(const Args& args, kv::RedisTierOptions* out);

}  // namespace cedar::cli
