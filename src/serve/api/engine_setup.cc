#include "serve/api/engine_setup.h"

#include "weights/residency_plan.h"

#include <filesystem>

#include <unistd.h>

#include "runtime/local_engine.h"
#include "serve/api/script_file.h"

namespace cedar::serve {
namespace {

constexpr int kScriptedDefaultContext = 65536;

Result<std::unique_ptr<runtime::Engine>> open_scripted(const EngineSetup& setup, const tokenizer::Tokenizer& tok) {
  CEDAR_ASSIGN_OR_RETURN(ScriptFile script, load_script(setup.script_path, tok));
  script.options.max_batch = setup.max_batch;
  script.options.max_queue = setup.max_queue;
  runtime::EngineInfo info;
  info.model_id = "cedar-scripted";
  info.vocab_size = tok.vocab_size();
  info.bos_id = tok.bos_id().value_or(0);
  info.eos_id = tok.eos_id().value_or(1);
  info.max_context = setup.max_context > 0 ? setup.max_context : kScriptedDefaultContext;
  info.max_batch = script.options.max_active > 0 ? script.options.max_active : setup.max_batch;
  const tokenizer::Tokenizer* t = &tok;
  auto detokenize = [t](std::span<const int32_t> ids) {
    auto text = t->decode(ids, /*skip_special=*/false);
    return text.ok() ? *text : std::string();
  };
  return std::unique_ptr<runtime::Engine>(
      new ScriptedEngine(std::move(script.replies), info, script.options, std::move(detokenize)));
}

}  // namespace

Result<ServingEngine> open_serving_engine(const EngineSetup& setup) {
  if (setup.model_dir.empty() == setup.script_path.empty())
    return invalid_argument("give exactly one of -m DIR (a checkpoint) or --scripted FILE (a test script)");
  // Checked first so that a mistyped -m names the folder, not the tokenizer.json it lacks.
  if (!setup.model_dir.empty() && !std::filesystem::is_directory(setup.model_dir))
    return invalid_argument("the model folder '" + setup.model_dir +
                            "' does not exist (or is not a directory); give -m the checkpoint directory holding "
                            "config.json, the safetensors shards and tokenizer.json");
  if (!setup.tokenizer_dir.empty() && !std::filesystem::is_directory(setup.tokenizer_dir))
    return invalid_argument("the tokenizer folder '" + setup.tokenizer_dir +
                            "' does not exist (or is not a directory); give --tokenizer the directory holding "
                            "tokenizer.json");
  const std::string tokenizer_dir = setup.tokenizer_dir.empty() ? setup.model_dir : setup.tokenizer_dir;
  if (tokenizer_dir.empty())
    return invalid_argument("--scripted needs --tokenizer DIR (a directory holding tokenizer.json)");
  ServingEngine out;
  CEDAR_ASSIGN_OR_RETURN(out.tokenizer, tokenizer::Tokenizer::load_dir(tokenizer_dir));
  if (!setup.model_dir.empty()) {
    runtime::EngineOptions options;
    options.max_batch = setup.max_batch;
    options.max_queue = setup.max_queue;
    if (setup.max_context > 0) options.max_context = setup.max_context;
    options.threads = setup.threads;
    options.prefill_chunk = setup.prefill_chunk;
    options.cache_dir = setup.cache_dir;
    options.kv_tier = setup.kv_tier;
    options.kv_memory_bytes = setup.kv_memory_bytes;
    if (options.kv_memory_bytes == 0) {
      const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
      if (pages > 0 && page > 0) options.kv_memory_bytes = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / 4;
    }
    options.replay_full = setup.replay_full;
    options.numerics = setup.numerics;
    options.speculative = setup.speculative;
    options.residency = setup.residency;
    if (setup.auto_budget) options.residency.memory_budget = model::default_memory_budget(options.kv_memory_bytes);
    CEDAR_ASSIGN_OR_RETURN(out.engine, runtime::make_engine(setup.model_dir, options));
    out.description = "model " + setup.model_dir;
  } else {
    CEDAR_ASSIGN_OR_RETURN(out.engine, open_scripted(setup, *out.tokenizer));
    out.description = "scripted engine (" + setup.script_path + ")";
  }
  return out;
}

}  // namespace cedar::serve
