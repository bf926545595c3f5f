// cedar's public API for front ends (tools/): the engine, cedar's one decode loop.
// runtime::Engine (submit -> GenerationStream, a token stream with cancel()), runtime::generate,
// make_engine over a loaded model with its EngineOptions, the speculative-decoding modes, and the
// shared KV tier's options (kv::RedisTierOptions, --kv-tier).
#pragma once

#include "kv/redis_tier.h"
#include "runtime/engine.h"
#include "runtime/local_engine.h"
#include "runtime/speculative.h"
