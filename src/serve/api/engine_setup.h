// Opens the engine and tokenizer that `cedar serve` and `cedar chat` run over: the real model
// (runtime::make_engine over a checkpoint directory) or the ScriptedEngine test hook (a script
// file plus a tokenizer directory). Choosing the engine happens in open_serving_engine() only.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "kv/redis_tier.h"
#include "model/model.h"
#include "ops/kernel_set.h"
#include "runtime/engine.h"
#include "runtime/speculative.h"
#include "tokenizer/tokenizer.h"

namespace cedar::serve {

struct EngineSetup {
  std::string model_dir;      // a checkpoint directory: the real engine
  std::string script_path;    // or a script file: the ScriptedEngine
  std::string tokenizer_dir;  // tokenizer.json (+ tokenizer_config.json); default: model_dir
  int max_context = 0;        // 0: the engine's default
  int max_batch = 16;         // sequences the real engine advances together
  int max_queue = 64;         // the real engine's own waiting room
  int threads = 0;            // compute threads of the real engine; 0 = all cores
  int prefill_chunk = 512;    // prompt tokens prefilled per engine step (runtime::EngineOptions)
  std::string cache_dir;      // durable prefix cache directory (empty: memory only)
  kv::RedisTierOptions kv_tier;  // --kv-tier: the shared third level of the prefix cache (url empty: none)
  bool replay_full = false;   // after a prefix hit recompute the whole prompt instead of bounded replay
  uint64_t kv_memory_bytes = 0;  // running sequences' working state limit; 0: a quarter of the RAM
  ops::Numerics numerics = ops::Numerics::kFast;  // --numerics: the commands default to fast
  // --memory-budget / --residency-stats. auto_budget: the budget is what the machine can spare
  // beside kv_memory_bytes (model::default_memory_budget).
  model::ResidencyOptions residency;
  bool auto_budget = false;
  runtime::SpeculativeMode speculative = runtime::SpeculativeMode::kOff;  // --speculative (docs/DSPARK.md)
};

struct ServingEngine {
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<runtime::Engine> engine;
  std::string description;  // for the start-up line: "model /path" or "scripted engine (FILE)"
};

// Exactly one of model_dir / script_path must be set (InvalidArgument otherwise).
Result<ServingEngine> open_serving_engine(const EngineSetup& setup);

}  // namespace cedar::serve
