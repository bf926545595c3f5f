// LocalEngine: the Engine over an in-process Model, and cedar's one decode loop (`cedar generate`,
// `chat`, `serve` and the benchmarks all run it). A scheduler thread runs continuous batching:
// every step it admits waiting requests, gives the prefilling ones a share of the step's prefill
// budget (chunked prefill: a long prompt advances a chunk per step, in the same forward call as
// one decode token of every other running sequence, so it never stalls them for its whole
// prefill), samples one token per sequence that finished its prompt, and retires finished ones.
#pragma once

#include <memory>
#include <string>

#include "kv/redis_tier.h"
#include "model/model.h"
#include "ops/kernel_set.h"
#include "runtime/engine.h"
#include "runtime/speculative.h"

namespace cedar::runtime {

struct EngineOptions {
  int max_batch = 8;            // sequences advanced together per step
  int max_queue = 64;           // waiting requests beyond the batch; more -> ResourceExhausted (429)
  int max_context = 8192;       // prompt + output tokens per request
  int threads = 0;              // 0 = all cores
  // Prompt tokens a step prefills at most, over all prefilling sequences (first come, first
  // served); 0 = whole prompts in one step (the reference's one-call prefill). A chunk after the
  // first takes the decode path (docs/NUMERICS.md "Prefill, chunks and decode").
  int prefill_chunk = 0;
  // Server-wide limit on the working state of running sequences (packed KV, windows, compressor
  // state: model::sequence_state_bytes of prompt + max_tokens). 0: none. Requests wait for room;
  // one that cannot fit even alone is refused with InvalidArgument.
  uint64_t kv_memory_bytes = 0;
  bool index_keys_owner = false;  // --index-keys owner
  // Prefix cache: sessions survive across requests (memory) and restarts (disk, when cache_dir is set).
  bool prefix_cache = true;
  std::string cache_dir;
  uint64_t cache_budget_bytes = 8ull << 30;
  uint32_t kv_block_tokens = 64;
  kv::RedisTierOptions kv_tier;   // --kv-tier: the prefix cache's shared third level (url empty: none)
  bool replay_full = false;       // recompute whole prompts after a hit (exact) instead of bounded replay
  bool decoder_narrowing = false;
  // Constrained decoding: how long past its forward pass a step waits for the token masks. A
  // sequence whose mask is later sits that step out (the others go on), and a constraint whose mask
  // took longer than this is computed on a separate thread from then on (runtime/mask_prefetcher.h).
  double mask_budget_seconds = 0.05;
  // Kernel set (ops/kernel_set.h). The library default is exact; `cedar serve` and `cedar chat`
  // default to fast (serve::EngineSetup).
  ops::Numerics numerics = ops::Numerics::kExact;
  // Memory budget and streaming (model/model.h); the library default maps everything.
  model::ResidencyOptions residency;
  // Speculative decoding with the checkpoint's DSpark draft head (runtime/speculative.h): a sequence
  // running alone drafts and verifies several tokens per pass. kOn fails without DSpark stages.
  SpeculativeMode speculative = SpeculativeMode::kOff;
  bool speculative_guard = true;  // off: every step verifies a whole drafted block (tests)
};

// Loads the checkpoint in `model_dir` and starts the scheduler.
Result<std::unique_ptr<Engine>> make_engine(const std::string& model_dir, const EngineOptions& options);
// The same over a model already loaded (`cedar generate` reports on it before the first token);
// the model's options win over the model fields of `options`. `model_id` names it in EngineInfo.
Result<std::unique_ptr<Engine>> make_engine(std::unique_ptr<model::Model> model, const EngineOptions& options,
                                            std::string model_id);

}  // namespace cedar::runtime
